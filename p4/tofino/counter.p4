/* counter.p4: the packet's verdict, from what worker_bitmap.p4 and use_key.p4 returned.
 *
 * (v1model: ../worker_bitmap.p4 and ../counter.p4; emulator: switch_emulator/bitmap.py, the same
 * verdicts.)  No register of its own: a use is complete when no worker of the job is missing.
 *   done   = missing == 0 before the packet (complete, or never used)
 *   same   = the cell's key was the packet's (tag, op, word_count)      (use_key.p4's predicate)
 *   ok     = same, the offset equal and not 0xFFFFFFFF (not poisoned)
 *   unseen = the sender was still missing (missing & mine != 0)
 * Verdicts (switch_emulator/bitmap.py names):
 *   done, not same:                FIRST (complete when the job has one worker: others == 0)
 *   done, ok:                      ANSWER for a retransmission (FLAG_RETRANSMIT), else STALE
 *   done, same, not ok:            DUPLICATE
 *   open, ok, unseen:              ADD (complete when no other worker is left: left == 0)
 *   open, seen:                    DUPLICATE
 *   open, unseen, otherwise:       CONFLICT (the sender is marked: a poisoned use never completes)
 * meta.path tells the words (combine.p4) what to do: write, combine, read, or nothing.
 */
#ifndef HOMAGG_TOFINO_COUNTER_P4
#define HOMAGG_TOFINO_COUNTER_P4

control Completion(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    action first()     { meta.path = PATH_FIRST; meta.first = 1; meta.verdict = VERDICT_FIRST; }
    action add()       { meta.path = PATH_ADD;   meta.verdict = VERDICT_ADD; }
    action answer()    { meta.path = PATH_READ;  meta.verdict = VERDICT_ANSWER; }
    action stale()     { meta.path = PATH_NONE;  meta.verdict = VERDICT_STALE; }
    action duplicate() { meta.path = PATH_NONE;  meta.verdict = VERDICT_DUPLICATE; }
    action conflict()  { meta.path = PATH_NONE;  meta.verdict = VERDICT_CONFLICT; }

    table verdict {
        key = {
            meta.missing    : ternary;
            meta.use_pred   : ternary;
            meta.unseen     : ternary;
            meta.offset_max : ternary;
            hdr.homagg.flags : ternary;
        }
        actions = { first; add; answer; stale; duplicate; conflict; }
        const default_action = conflict();
        size = 16;   /* first matching row wins */
        const entries = {
            (0, PRED_OTHER, _, _, _)               : first();
            (0, PRED_OTHER_SAME_OFFSET, _, _, _)   : first();
            (0, PRED_SAME, _, 0, FLAG_RETRANSMIT &&& FLAG_RETRANSMIT) : answer();
            (0, PRED_SAME, _, 0, _)                : stale();
            (0, PRED_SAME_OTHER_OFFSET, _, _, _)   : duplicate();
            (0, _, _, _, _)                        : duplicate();   /* PRED_SAME with offset 0xFFFFFFFF */
            (_, _, 0, _, _)                        : duplicate();
            (_, PRED_SAME, _, 0, _)                : add();
            (_, _, _, _, _)                        : conflict();
        }
    }

    apply {
        verdict.apply();
        if (meta.path == PATH_FIRST) {
            if (meta.others == 0) {
                meta.complete = true;
            }
        } else if (meta.path == PATH_ADD) {
            if (meta.left == 0) {
                meta.complete = true;
            }
        } else if (meta.path == PATH_READ) {
            meta.complete = true;
        }
    }
}

#endif
