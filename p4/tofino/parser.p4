/* parser.p4: ingress and egress parsers.
 *
 * Ingress: Ethernet / IPv4 (no options, not a fragment) / UDP / homagg header / words, like the
 * v1model parser (../parser.p4) but without its loop: Tofino's parser rejects a loop over a
 * header stack's index, so there is one state per word, each ending the packet's words when
 * word_count says so.  1 <= word_count <= TOFINO_WORDS is parsed; other counts leave words[]
 * empty (dropped by admission when addressed to the switch, forwarded untouched otherwise).  A
 * datagram cut short sets parser_err (admission drops it as drop_short / drop_length).
 *
 * Egress: the bridged header the ingress deparser put first, then the headers up to homagg
 * (the words ride as payload: egress never touches them).
 */
#ifndef HOMAGG_TOFINO_PARSER_P4
#define HOMAGG_TOFINO_PARSER_P4

#define WORD_STATE(I, N) \
    state parse_word_##I { \
        pkt.extract(hdr.words[I]); \
        transition select(hdr.homagg.word_count) { \
            N: accept; \
            default: parse_word_##N; \
        } \
    }

parser HomaggIngressParser(packet_in pkt, out tofino_headers_t hdr, out ig_meta_t meta,
                           out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        /* every metadata field starts defined (the ingress relies on these values) */
        meta.to_switch = false;
        meta.drop_reason = (bit<8>) DROP_NONE;
        meta.world_size = 0;
        meta.mcast_grp = 0;
        meta.worker_port = 0;
        meta.mine = 0;
        meta.source_known = 0;
        meta.job_ok = 0;
        meta.token_ok = 0;
        meta.words_ok = 0;
        meta.in_range = 0;
        meta.length_ok = 0;
        meta.others = 0;
        meta.offset_max = 0;
        meta.cell = 0;
        meta.key_rest = 0;
        meta.missing = 0;
        meta.unseen = 0;
        meta.left = 0;
        meta.use_pred = 0;
        meta.path = 0;
        meta.verdict = 0;
        meta.first = 0;
        meta.complete = false;
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dst_port) {
            HOMAGG_UDP_PORT: parse_homagg;
            default: accept;
        }
    }

    state parse_homagg {
        pkt.extract(hdr.homagg);
        transition select(hdr.homagg.word_count) {
            0: accept;                              /* no words: admission drops it */
            1 .. TOFINO_WORDS: parse_word_0;
            default: accept;                        /* too many: admission drops it */
        }
    }

    WORD_STATE(0, 1)   WORD_STATE(1, 2)   WORD_STATE(2, 3)   WORD_STATE(3, 4)
    WORD_STATE(4, 5)   WORD_STATE(5, 6)   WORD_STATE(6, 7)   WORD_STATE(7, 8)
    WORD_STATE(8, 9)   WORD_STATE(9, 10)  WORD_STATE(10, 11) WORD_STATE(11, 12)
    WORD_STATE(12, 13) WORD_STATE(13, 14) WORD_STATE(14, 15) WORD_STATE(15, 16)
    WORD_STATE(16, 17) WORD_STATE(17, 18) WORD_STATE(18, 19) WORD_STATE(19, 20)
    WORD_STATE(20, 21) WORD_STATE(21, 22) WORD_STATE(22, 23) WORD_STATE(23, 24)
    WORD_STATE(24, 25) WORD_STATE(25, 26) WORD_STATE(26, 27) WORD_STATE(27, 28)
    WORD_STATE(28, 29) WORD_STATE(29, 30) WORD_STATE(30, 31)

    state parse_word_31 {
        pkt.extract(hdr.words[31]);
        transition accept;
    }
}

#undef WORD_STATE

parser HomaggEgressParser(packet_in pkt, out tofino_headers_t hdr, out eg_meta_t meta,
                          out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        pkt.extract(hdr.ethernet);
        transition select(hdr.bridge.kind) {
            BRIDGE_FORWARD: accept;
            default: parse_ipv4;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.homagg);
        transition accept;
    }
}

#endif
