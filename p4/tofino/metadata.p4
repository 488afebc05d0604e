/* metadata.p4: the Tofino program's bridged header and per-packet metadata.
 *
 *  bridge_h (ingress -> egress, 4 bytes, emitted before Ethernet and removed by the egress parser):
 *  +---------------+-------------+-+-----------------------------+
 *  |     kind      |   pad (7)   |  ingress_port (9) | pad (8)   |
 *  +---------------+-------------+-+-----------------------------+
 *
 * Invariants: drop_reason == DROP_NONE while a packet is still being aggregated; mine has exactly
 * the bit worker_id set once admission ran; cell = 2 * slot + bank and slot_index = slot, valid
 * when drop_reason == DROP_NONE after admission.
 */
#ifndef HOMAGG_TOFINO_METADATA_P4
#define HOMAGG_TOFINO_METADATA_P4

header bridge_h {
    bit<8>   kind;           /* BRIDGE_* */
    bit<7>   pad0;
    PortId_t ingress_port;   /* 9 bits on Tofino 1 and 2 */
    bit<8>   pad1;
}

struct tofino_headers_t {
    bridge_h   bridge;
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    homagg_t   homagg;
    word_t[32] words;        /* P4_WORDS; TOFINO_WORDS of them are parsed */
}

struct ig_meta_t {
    bool     to_switch;      /* addressed to the aggregation service */
    bit<8>   drop_reason;    /* DROP_* (fits the drop_reasons counter index) */
    bit<8>   world_size;
    bit<16>  mcast_grp;
    PortId_t worker_port;
    bit<32>  mine;           /* 1 << worker_id */
    bit<1>   source_known;   /* admission.p4's lookups: 1 on a hit */
    bit<1>   job_ok;
    bit<1>   token_ok;
    bit<1>   words_ok;
    bit<1>   in_range;
    bit<1>   length_ok;
    bit<16>  cell;           /* 2 * slot + bank */
    bit<16>  slot_index;     /* slot */
    bit<32>  old_bitmap;     /* the cell's worker bitmap before this packet */
    bit<32>  seen;           /* old_bitmap & mine */
    bit<32>  key_rest;       /* tag ++ op ++ word_count[7:0]: the key's second half (use_key.p4) */
    bit<1>   offset_match;   /* use_key.p4: 1 when the stored offset equals the packet's */
    bit<1>   rest_match;     /* ... and the stored (tag, op, word_count) */
    bit<3>   path;           /* PATH_*: the counter's access */
    bit<8>   count;          /* contributions after this packet (counter.p4) */
    bit<8>   verdict;        /* VERDICT_* */
    bit<1>   first;          /* 1 on PATH_FIRST: the word RegisterActions write, not combine */
    bool     complete;
}

struct eg_meta_t {
}

#endif
