/* parser.p4: Ethernet / IPv4 (no options) / UDP / homagg header / 1..32 payload words.
 *
 * A UDP datagram is taken as homagg's only if its destination port is HOMAGG_UDP_PORT; its payload
 * words are extracted one by one into the words[] stack when 1 <= word_count <= P4_WORDS; other
 * counts leave words[] empty (dropped by admission when addressed to the switch, forwarded
 * untouched otherwise).  A datagram shorter than its header or its words ends the parser with
 * PacketTooShort (v1model still runs ingress: admission drops it as short / length).  Anything else
 * is left unparsed and forwarded by forward.p4.
 */
#ifndef HOMAGG_PARSER_P4
#define HOMAGG_PARSER_P4

parser HomaggParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t standard_metadata) {
    state start {
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
        meta.words_left = hdr.homagg.word_count;
        transition select(hdr.homagg.word_count) {
            0: accept;                      /* no words: admission drops it */
            0 &&& 0xFFE0: parse_words;      /* 1 .. 31 */
            P4_WORDS: parse_words;          /* 32 */
            default: accept;                /* too many words: admission drops it */
        }
    }

    /* word_count words into the header stack; an early end of packet leaves words invalid. */
    state parse_words {
        pkt.extract(hdr.words.next);
        meta.words_left = meta.words_left - 1;
        transition select(meta.words_left) {
            0: accept;
            default: parse_words;
        }
    }
}

#endif
