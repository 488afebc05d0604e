/* parser.p4: ingress and egress parsers.
 *
 * Ingress: Ethernet / IPv4 (no options, not a fragment) / UDP / homagg header / words, like the
 * v1model parser (../parser.p4) but without its loop: Tofino's parser rejects a loop over a
 * header stack's index, so there is one state per word the program aggregates (parse_word_0 ..
 * parse_word_<TOFINO_WORDS - 1>, from ../words.p4's list, as the Word stages in pipeline.p4),
 * each ending the packet's words when word_count says so.  1 <= word_count <= TOFINO_WORDS is
 * parsed, exactly word_count words; other counts leave words[] empty (dropped by admission when
 * addressed to the switch, forwarded untouched otherwise).  A
 * datagram cut short sets parser_err (admission drops it as drop_short / drop_length).
 *
 * Egress: the bridged header the ingress deparser put first, then the headers up to homagg
 * (the words ride as payload: egress never touches them).
 */
#ifndef HOMAGG_TOFINO_PARSER_P4
#define HOMAGG_TOFINO_PARSER_P4

/* the state of payload word I (../words.p4's list): extract it; accept when it is the packet's
 * last (word_count == N = I + 1), else go on to word N */
#define WORD_STATE(NN, I, N) \
    state parse_word_##I { \
        pkt.extract(hdr.words[I]); \
        transition select(hdr.homagg.word_count) { \
            N: accept; \
            default: parse_word_##N; \
        } \
    }
#define WORD_STATE_NAME(N) WORD_STATE_NAME_(N)
#define WORD_STATE_NAME_(N) parse_word_##N

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
        meta.child = 0;
        meta.parent_port = 0;
        meta.down_grp = 0;
        meta.parent_known = 0;
        meta.parent_token_ok = 0;
        meta.down = 0;
        meta.count_tree = 0;
        meta.tree_event = 0;
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

    FOR_FIRST_WORDS(TOFINO_WORDS, WORD_STATE)

    /* after word TOFINO_WORDS - 1: never reached (that word accepts, as word_count <= TOFINO_WORDS) */
    state WORD_STATE_NAME(TOFINO_WORDS) {
        transition accept;
    }
}

#undef WORD_STATE
#undef WORD_STATE_NAME
#undef WORD_STATE_NAME_

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
