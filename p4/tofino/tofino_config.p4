/* tofino_config.p4: constants only the Tofino program needs (the shared ones: ../configuration.p4).
 *
 * TOFINO_WORDS: payload words one pass aggregates (K on this target).  A job is admitted with
 * words_per_packet <= TOFINO_WORDS (homagg/p4/bfrt.py refuses more; the data plane drops more as
 * drop_word_count); the wire header and the parser allow up to P4_WORDS.  What bounds it: one
 * register per word, one stateful ALU per register, 4 stateful ALUs per stage, and the stages the
 * verdict chain (admission, mark, offset check, verdict) takes before the first word (docs/p4-tofino.md).
 */
#ifndef HOMAGG_TOFINO_CONFIG_P4
#define HOMAGG_TOFINO_CONFIG_P4

#ifndef TOFINO_WORDS
#if __TARGET_TOFINO__ == 2
#define TOFINO_WORDS 32
#else
#define TOFINO_WORDS 28
#endif
#endif

const bit<16> TOFINO_K          = TOFINO_WORDS;  /* words per pass, as a P4 constant */

const bit<32> JOB_ENTRIES       = 1024;    /* jobs the word_limit and slot_range tables hold */

/* What the words do with the packet (counter.p4 sets it with the verdict; combine.p4 keys on it). */
const bit<3>  PATH_NONE         = 0;       /* leave the cells alone (dropped packets) */
const bit<3>  PATH_FIRST        = 1;       /* write the payload (FIRST) */
const bit<3>  PATH_ADD          = 2;       /* combine the payload (ADD) */
const bit<3>  PATH_READ         = 3;       /* read the result (ANSWER) */
const bit<3>  PATH_DOWN         = 4;       /* trees: write the parent's result, when down was 0 (meta.first) */

/* Verdicts on a result from the job's parent (trees, docs/trees.md), beside ../configuration.p4's
 * VERDICT_* of a member's packet (counter.p4 sets them; replicate.p4 acts on them). */
const bit<8>  VERDICT_RESULT_DOWN  = 6;    /* the cell's current use, complete here: down test-and-set */
const bit<8>  VERDICT_STALE_RESULT = 7;    /* another use, or one still in progress here: drop */

/* use_key.p4's predicate: 1 << (offset equal + 2 * key equal), before the packet. */
const bit<4>  PRED_OTHER        = 1;       /* another key */
const bit<4>  PRED_OTHER_SAME_OFFSET = 2;  /* another key, the same offset */
const bit<4>  PRED_SAME_OTHER_OFFSET = 4;  /* the use's key, another offset */
const bit<4>  PRED_SAME         = 8;       /* the use's key and offset */

/* Bridged from ingress to egress (metadata.p4: bridge_h.kind). */
const bit<8>  BRIDGE_FORWARD    = 0;       /* ordinary L2 forwarding */
const bit<8>  BRIDGE_RESULT     = 1;       /* a result copy: rewrite for its worker (rid) */
const bit<8>  BRIDGE_ANSWER     = 2;       /* a unicast answer: worker_id already set */
const bit<8>  BRIDGE_UP         = 3;       /* trees: a completed use sent up to the parent (flags 0) */
const bit<8>  BRIDGE_UP_RETRANSMIT = 4;    /* trees: sent up again, FLAG_RETRANSMIT (ANSWER, down 0) */

const bool CHECK_TOFINO_WORDS = static_assert(TOFINO_K >= 1 && TOFINO_K <= P4_WORDS,
                                              "1 <= TOFINO_WORDS <= P4_WORDS (the words[] stack)");

#endif
