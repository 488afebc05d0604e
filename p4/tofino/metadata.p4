/* metadata.p4: the Tofino program's bridged header and per-packet metadata.
 *
 *  bridge_h (ingress -> egress, 4 bytes, emitted before Ethernet and removed by the egress parser):
 *  +---------------+-------------+-+-----------------------------+
 *  |     kind      |   pad (7)   |  ingress_port (9) | pad (8)   |
 *  +---------------+-------------+-+-----------------------------+
 *
 * Invariants: drop_reason == DROP_NONE while a packet is still being aggregated; mine has exactly
 * the bit worker_id set once admission ran, others the job's other workers; cell = 2 * slot + bank, valid
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

/* the stateful ALUs' two 32-bit packet inputs (worker_bitmap.p4, use_key.p4) must each sit in one
 * 32-bit container, or the input crossbar cannot feed both ("could not fit within the input
 * crossbar by itself": measured) */
@pa_container_size("ingress", "meta.key_rest", 32)
@pa_container_size("ingress", "meta.others", 32)
struct ig_meta_t {
    bool     to_switch;      /* addressed to the aggregation service */
    bit<8>   drop_reason;    /* DROP_* (fits the drop_reasons counter index) */
    bit<8>   world_size;
    bit<16>  mcast_grp;
    PortId_t worker_port;
    bit<32>  mine;           /* 1 << worker_id */
    bit<1>   child;          /* trees: the job has a parent (admission entry): complete uses go up */
    PortId_t parent_port;    /* trees: the port towards the job's parent (admission entry) */
    bit<16>  down_grp;       /* trees: the job's group, for a result from its parent (from_parent entry) */
    bit<1>   parent_known;   /* trees: from_parent hit (the source is the job's parent) */
    bit<1>   parent_token_ok;/* trees: parent_token hit (and the token is the job's) */
    bit<1>   down;           /* trees: counter.p4's down bit of the cell, read on an ANSWER */
    bit<1>   count_tree;     /* trees: replicate.p4 counts tree_events[tree_event] */
    bit<8>   tree_event;     /* TREE_* */
    bit<1>   source_known;   /* admission.p4's lookups: 1 on a hit */
    bit<1>   job_ok;
    bit<1>   token_ok;
    bit<1>   words_ok;
    bit<1>   in_range;
    bit<1>   length_ok;
    bit<32>  others;         /* the job's workers but the sender (admitted_job entry) */
    bit<1>   offset_max;     /* the packet's offset is 0xFFFFFFFF (never a use's: use_key.p4) */
    bit<16>  cell;           /* 2 * slot + bank */
    bit<32>  key_rest;       /* tag ++ op ++ word_count[7:0]: the use key without the offset */
    bit<32>  missing;        /* worker_bitmap.p4: the cell's missing workers before this packet */
    bit<32>  unseen;         /* missing & mine: nonzero when the sender was not yet marked */
    bit<32>  left;           /* missing & others: 0 when the sender was the last one missing */
    bit<4>   use_pred;       /* use_key.p4: PRED_* (key and offset equal before the packet) */
    bit<3>   path;           /* PATH_*: what the words do (counter.p4) */
    bit<8>   verdict;        /* VERDICT_* */
    bit<1>   first;          /* 1 on PATH_FIRST, and on PATH_DOWN when down was 0 (the result is
                              * taken): the word RegisterActions write, not combine */
    bool     complete;
}

struct eg_meta_t {
}

#endif
