/* Verdict codes: why the dataplane passed, dropped or forwarded a packet.
 * One counter per code (verdict_stats). Mirrored by agent/dataplane/verdicts.py;
 * tests/dataplane/test_dataplane_verdicts.py parses this file and compares, so
 * keep one "#define VERDICT_<NAME> <number>" per line.
 */
#ifndef FABRIC_VERDICTS_H
#define FABRIC_VERDICTS_H

#define VERDICT_PASS_NOT_IPV4 0          /* ARP, IPv6, anything not IPv4: untouched */
#define VERDICT_PASS_NOT_VIP 1           /* IPv4 to an address that is no VIP */
#define VERDICT_PASS_NOT_TCP_UDP 2       /* ICMP and other protocols, even to a VIP */
#define VERDICT_DROP_TRUNCATED 3         /* Ethernet, IPv4 or L4 header cut short */
#define VERDICT_DROP_IP_OPTIONS 4        /* IPv4 header with options to a VIP */
#define VERDICT_DROP_FRAGMENT 5          /* IPv4 fragment to a VIP (no ports to hash) */
#define VERDICT_DROP_UNKNOWN_PORT 6      /* VIP address, but no service on this port/proto */
#define VERDICT_DROP_NO_BACKEND 7        /* service has no backend with weight above 0 */
#define VERDICT_DROP_SNAT_EXHAUSTED 8    /* no free source port for a source-NAT flow */
#define VERDICT_FWD_NEW_FLOW 9           /* Maglev picked a backend; flow recorded */
#define VERDICT_FWD_ESTABLISHED 10       /* connection table hit */
#define VERDICT_REPLY_SNAT 11            /* reply of a source-NAT flow, reverse-NATed in XDP */
#define VERDICT_MAX 12

#endif
