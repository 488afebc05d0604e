/* headers.p4: packet headers and per-packet metadata.
 *
 * The homagg header (16 bytes, big-endian, docs/wire-format.md):
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
 * |                 payload: word_count x int32                   |
 *
 * This target accepts exactly word_count == P4_WORDS (32) words.
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
}

/* K = P4_WORDS = 32 payload words, w00 .. w31 (int32 in two's complement). */
header payload_t {
    bit<32> w00; bit<32> w01; bit<32> w02; bit<32> w03;
    bit<32> w04; bit<32> w05; bit<32> w06; bit<32> w07;
    bit<32> w08; bit<32> w09; bit<32> w10; bit<32> w11;
    bit<32> w12; bit<32> w13; bit<32> w14; bit<32> w15;
    bit<32> w16; bit<32> w17; bit<32> w18; bit<32> w19;
    bit<32> w20; bit<32> w21; bit<32> w22; bit<32> w23;
    bit<32> w24; bit<32> w25; bit<32> w26; bit<32> w27;
    bit<32> w28; bit<32> w29; bit<32> w30; bit<32> w31;
}

struct headers_t {
    ethernet_t ethernet;
    ipv4_t     ipv4;
    udp_t      udp;
    homagg_t   homagg;
    payload_t  payload;
}

/* Invariants: drop_reason == DROP_NONE while a packet is still being aggregated; cell and
 * other_cell are 2*slot+bank and 2*slot+(1-bank), valid only after slot_select. */
struct metadata_t {
    bool    to_switch;       /* addressed to the aggregation service (admission's first check) */
    bit<32> drop_reason;     /* DROP_* */
    bit<16> slot_base;       /* the job's slot range [slot_base, slot_base + slot_count) */
    bit<16> slot_count;
    bit<8>  num_workers;     /* contributions that complete a cell */
    bit<16> mcast_grp;       /* the job's result multicast group */
    bit<9>  worker_port;     /* egress port towards the sending worker (unicast answers) */
    bit<32> cell;
    bit<32> other_cell;
    bool    is_new;          /* first contribution of this worker to this cell */
    bool    first;           /* ... and the first of any worker: overwrite instead of combine */
    bool    complete;        /* the cell holds the result of all num_workers workers */
    bool    unicast;         /* answer only the sender (retransmission into a complete cell) */
}

#endif
