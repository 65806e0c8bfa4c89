/* Benchmark wrapper for BPF_PROG_TEST_RUN with repeat: the kernel re-runs a
 * program on its own output, so before each pass this wrapper copies the
 * original packet back from bench_input (and, for the new-flow case, gives it
 * a fresh source port and address, checksums kept valid, so every pass misses
 * the connection table), then tail-calls the program under test.
 * scripts/bench-xdp measures the wrapper around a bare XDP_PASS program too
 * and subtracts it. The input must be Ethernet/IPv4 (no options)/TCP.
 */
#include <uapi/linux/bpf.h>

#define BENCH_LEN 64
#define WORKING_SET 65536

struct bench_input {
    __u8 bytes[BENCH_LEN];
    __u32 vary;   /* 1: new source port/address each pass; 2: cycle through WORKING_SET of them */
    __u32 pad;
};

/* bench_input: the packet to restore before every pass */
BPF_ARRAY(bench_input, struct bench_input, 1);
/* bench_seq: pass counter for distinct flows (one per CPU: both CPUs run at once) */
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
            /* each CPU its own flows (both CPUs run at once, as RSS would spread them) */
            __u32 cpu = bpf_get_smp_processor_id() & 0x7F;
            if (in->vary == 2)  /* a rotating working set of WORKING_SET flows per CPU (set up first) */
                n = (n & (WORKING_SET - 1)) | (cpu << 16);
            else
                n = (n & 0x7FFFFF) | (cpu << 23);
            /* IPv4 source (bytes 26-29) low half and TCP source port (34-35):
             * 2^24 distinct flows; both checksums updated (RFC 1624) */
            __u16 old_src, old_sport, new_src, new_sport, ip_check, tcp_check;
            __builtin_memcpy(&old_src, data + 28, 2);
            __builtin_memcpy(&old_sport, data + 34, 2);
            __builtin_memcpy(data + 28, &n, 2);
            __builtin_memcpy(data + 34, (__u8 *)&n + 2, 1);
            __builtin_memcpy(data + 35, &n, 1);
            __builtin_memcpy(&new_src, data + 28, 2);
            __builtin_memcpy(&new_sport, data + 34, 2);
            __builtin_memcpy(&ip_check, data + 24, 2);
            __builtin_memcpy(&tcp_check, data + 50, 2);
            __u32 d = (__u16)~old_src + (__u32)new_src;
            __u32 sum = (__u16)~ip_check + d;
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            ip_check = ~sum;
            sum = (__u16)~tcp_check + d + (__u16)~old_sport + (__u32)new_sport;
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            tcp_check = ~sum;
            __builtin_memcpy(data + 24, &ip_check, 2);
            __builtin_memcpy(data + 50, &tcp_check, 2);
        }
    }
    bench_target.call(ctx, 0);
    return XDP_ABORTED;
}

int xdp_pass(struct xdp_md *ctx)
{
    return XDP_PASS;
}
