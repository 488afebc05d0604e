/* tofino_config.p4: constants only the Tofino program needs (the shared ones: ../configuration.p4).
 *
 * TOFINO_WORDS: payload words one pass aggregates (K on this target).  A job is admitted with
 * words_per_packet <= TOFINO_WORDS (homagg/p4/bfrt.py refuses more; the data plane drops more as
 * drop_word_count); the wire header and the parser allow up to P4_WORDS.  What bounds it: one
 * register per word, one stateful ALU per register, 4 stateful ALUs per stage, and the stages the
 * verdict chain (admission, bitmap, key, count) takes before the first word (docs/p4-tofino.md).
 */
#ifndef HOMAGG_TOFINO_CONFIG_P4
#define HOMAGG_TOFINO_CONFIG_P4

#ifndef TOFINO_WORDS
#if __TARGET_TOFINO__ == 2
#define TOFINO_WORDS 32
#else
#define TOFINO_WORDS 24
#endif
#endif

const bit<16> TOFINO_K          = TOFINO_WORDS;  /* words per pass, as a P4 constant */

const bit<32> JOB_ENTRIES       = 1024;    /* jobs the word_limit and slot_range tables hold */

/* Which register access the counter made (counter.p4: the verdict follows from it). */
const bit<3>  PATH_FIRST        = 0;
const bit<3>  PATH_ADD          = 1;
const bit<3>  PATH_SEEN         = 2;
const bit<3>  PATH_OTHER        = 3;
const bit<3>  PATH_LATE         = 4;

/* Bridged from ingress to egress (metadata.p4: bridge_h.kind). */
const bit<8>  BRIDGE_FORWARD    = 0;       /* ordinary L2 forwarding */
const bit<8>  BRIDGE_RESULT     = 1;       /* a result copy: rewrite for its worker (rid) */
const bit<8>  BRIDGE_ANSWER     = 2;       /* a unicast answer: worker_id already set */

const bool CHECK_TOFINO_WORDS = static_assert(TOFINO_K >= 1 && TOFINO_K <= P4_WORDS,
                                              "1 <= TOFINO_WORDS <= P4_WORDS (the words[] stack)");

#endif
