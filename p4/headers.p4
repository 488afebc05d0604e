/* headers.p4: packet headers and per-packet metadata.
 *
 * The homagg header (v2: 20 bytes, big-endian, docs/wire-format.md):
 *
 *  0                   1                   2                   3
 *  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
 * +-------+-------+---------------+-------------------------------+
 * |version|  op   |     flags     |            job_id             |
 * +-------+-------+---------------+-------------------------------+
 * |   worker_id   |   reserved    |          word_count           |
 * +-+-----------------------------+-------------------------------+
 * |b|          slot (15)          |              tag              |
 * +-+-----------------------------+-------------------------------+
 * |                            offset                             |
 * +---------------------------------------------------------------+
 * |                          job token                            |
 * +---------------------------------------------------------------+
 * |                 payload: word_count x int32                   |
 *
 * This target accepts 1 <= word_count <= P4_WORDS (32) words.
 */
#ifndef HOMAGG_HEADERS_P4
#define HOMAGG_HEADERS_P4

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdr_checksum;
    bit<32> src_addr;
    bit<32> dst_addr;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

header homagg_t {
    bit<4>  version;
    bit<4>  op;
    bit<8>  flags;
    bit<16> job_id;
    bit<8>  worker_id;
    bit<8>  reserved;
    bit<16> word_count;
    bit<1>  bank;
    bit<15> slot;
    bit<16> tag;
    bit<32> offset;
    bit<32> token;           /* the job's admission token (admission.p4 checks it) */
}

/* One int32 payload word; a packet carries word_count of them (1 .. P4_WORDS). */
header word_t {
    bit<32> value;
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    homagg_t   homagg;
    word_t[32] words;        /* P4_WORDS */
}

/* Invariants: drop_reason == DROP_NONE while a packet is still being aggregated; cell and
 * other_cell are 2*slot+bank and 2*slot+(1-bank), valid only after slot_select; count is the
 * cell's contribution count as read before this packet (after it, in completion). */
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
}

#endif
