/* metadata.p4: the v1model program's per-packet metadata (the Tofino program has its own,
 * p4/tofino/metadata.p4; the headers both parse are headers.p4). */
#ifndef HOMAGG_METADATA_P4
#define HOMAGG_METADATA_P4

/* Invariants: drop_reason == DROP_NONE while a packet is still being aggregated; cell and
 * other_cell are 2*slot+bank and 2*slot+(1-bank), valid only after slot_select; count is the
 * cell's contribution count as read before this packet (after it, in completion); the job's
 * configuration fields come from admit (a member's packet) or from_parent (a result from the
 * parent), equal for one job; the tree fields after child_id are valid only when is_child. */
struct metadata_t {
    bool    to_switch;       /* addressed to the aggregation service */
    bit<32> drop_reason;     /* DROP_* */
    bit<16> words_left;      /* parser loop counter */
    bit<16> job_id;          /* admitted source's job and worker */
    bit<8>  worker_id;
    bit<16> slot_base;       /* the job's slot range [slot_base, slot_base + n_slots) */
    bit<16> n_slots;
    bit<8>  world_size;      /* contributions that complete a cell */
    bit<16> words_per_packet;
    bit<16> mcast_grp;       /* the job's result multicast group */
    bit<9>  worker_port;     /* egress port towards the sending worker (unicast answers) */
    bit<32> epoch;           /* the job's admission epoch (state.p4: cells of other epochs read as zero) */
    bit<32> token;           /* the job's admission token, installed by the controller */
    bit<32> cell;
    bit<32> other_cell;
    bit<8>  count;
    bit<8>  verdict;         /* VERDICT_* */
    bool    complete;        /* this packet completed the cell (FIRST/ADD), or it was (ANSWER) */
    bool    unicast;         /* answer only the sender */
    /* trees (tree.p4, docs/trees.md) */
    bool    from_parent;     /* a result from the job's parent (FLAG_RESULT, parent_result hit) */
    bool    is_child;        /* the job has a parent at this switch (uplink hit): these below are set */
    bool    down;            /* the cell's down bit as read by an ANSWER at a child */
    bool    up;              /* this packet goes up to the parent (rewritten in ingress) */
    bit<8>  child_id;        /* this switch's worker id at the parent */
    bit<48> switch_mac;      /* this switch's data address: the up packet's source */
    bit<32> switch_ip;
    bit<48> parent_mac;      /* the parent's data address and the port towards it */
    bit<32> parent_ip;
    bit<16> parent_port;
    bit<9>  uplink_port;
}

#endif
