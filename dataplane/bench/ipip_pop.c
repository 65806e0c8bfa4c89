/* In front of dataplane/bpf/bench.c's xdp_bench when the program under test pushes
 * an IPIP header (Fabric's dsr-ipip services: scripts/bench-xdp, scripts/bench_xdp_ablate.py).
 * BPF_PROG_TEST_RUN with repeat runs every pass on the previous pass's output, and a
 * dsr-ipip output is its input with a 20-byte outer IPv4 header pushed in front
 * (bpf_xdp_adjust_head): left alone, each pass would eat 20 bytes of the 256-byte
 * headroom until the encapsulation fails. This program pops what the last pass pushed,
 * then tail-calls xdp_bench, which restores the original bytes (and varies the flow)
 * and tail-calls the program under test. The helper is called on every pass, with
 * delta 0 when nothing was pushed, so it costs the same around the program under test
 * as around the bare XDP_PASS program whose wrapper time the benchmark subtracts.
 */
#include <uapi/linux/bpf.h>

#define BENCH_LEN 64   /* bench.c */
#define IPIP_LEN 20    /* the outer IPv4 header of a dsr-ipip packet */

/* shim_next: slot 0 is bench.c's xdp_bench */
BPF_PROG_ARRAY(shim_next, 1);

int ipip_pop(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    int delta = 0;
    if (data + BENCH_LEN + IPIP_LEN <= data_end)
        delta = IPIP_LEN;
    bpf_xdp_adjust_head(ctx, delta);
    shim_next.call(ctx, 0);
    return XDP_ABORTED;
}
