/* headers.p4: packet headers, shared by the v1model program (p4/) and the Tofino program (p4/tofino/).
 *
 * Only header types and the headers_t struct live here (no architecture-specific types): the
 * v1model's per-packet metadata is metadata.p4, the Tofino's p4/tofino/metadata.p4.
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

#endif
