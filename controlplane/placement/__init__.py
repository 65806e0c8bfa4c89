"""Placement: where replicas go (the free-capacity index), who makes room (preemption), and how
many more fit (capacity). Each module is a pure planner over plain data; the filters and scores
themselves stay in ``controlplane.placement.scheduler`` so every planner judges a node the same way."""
