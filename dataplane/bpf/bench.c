/* Benchmark wrapper for BPF_PROG_TEST_RUN with repeat: the kernel re-runs a
 * program on its own output, so before each pass this wrapper copies the
 * original packet back from bench_input (and, for the new-flow case, gives it
 * a fresh source port and address so every pass misses the connection table),
 * then tail-calls the program under test. scripts/bench-xdp measures the
 * wrapper around a bare XDP_PASS program too and subtracts it.
 */
#include <uapi/linux/bpf.h>

#define BENCH_LEN 64

struct bench_input {
    __u8 bytes[BENCH_LEN];
    __u32 vary;   /* 1: new source port/address each pass */
    __u32 pad;
};

/* bench_input: the packet to restore before every pass */
BPF_ARRAY(bench_input, struct bench_input, 1);
/* bench_seq: pass counter for distinct flows */
BPF_PERCPU_ARRAY(bench_seq, __u32, 1);
/* bench_target: the program under test, slot 0 */
BPF_PROG_ARRAY(bench_target, 1);

int xdp_bench(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    __u32 zero = 0;
    struct bench_input *in = bench_input.lookup(&zero);
    if (!in || data + BENCH_LEN > data_end)
        return XDP_ABORTED;
    __builtin_memcpy(data, in->bytes, BENCH_LEN);
    if (in->vary) {
        __u32 *seq = bench_seq.lookup(&zero);
        if (seq) {
            __u32 n = ++*seq;
            /* IPv4 source (bytes 26-29) low half and TCP source port (34-35) */
            __builtin_memcpy(data + 28, &n, 2);
            __builtin_memcpy(data + 34, (__u8 *)&n + 2, 1);
            __builtin_memcpy(data + 35, &n, 1);
        }
    }
    bench_target.call(ctx, 0);
    return XDP_ABORTED;
}

int xdp_pass(struct xdp_md *ctx)
{
    return XDP_PASS;
}
