from agent.engine_sim.cli import main

main()
