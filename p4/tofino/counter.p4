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
 * A result from the job's parent (trees, docs/trees.md; FLAG_RESULT, past admission, which
 * peeked at both registers):
 *   done, the same key and offset: RESULT_DOWN, down's test-and-set: taken (meta.first = 1: the
 *                                  words write the payload) only when down was 0
 *   otherwise:                     STALE_RESULT (another use, or one still in progress here)
 * meta.path tells the words (combine.p4) what to do: write, combine, read, or nothing.
 *
 * down (trees): one bit per cell, the parent's result of the current use is in the words.  One
 * RegisterAction per pass, from the verdict's action: cleared on FIRST, read on ANSWER (a child
 * answers from its cell only when down is 1, else sends the use up again), test-and-set on
 * RESULT_DOWN.  At a root it is cleared and read but never set: ANSWER always unicasts there.
 */
#ifndef HOMAGG_TOFINO_COUNTER_P4
#define HOMAGG_TOFINO_COUNTER_P4

control Completion(inout tofino_headers_t hdr, inout ig_meta_t meta) {
    Register<bit<1>, bit<16>>(POOL_CELLS) down;

    RegisterAction<bit<1>, bit<16>, bit<1>>(down) clear_down = {
        void apply(inout bit<1> value) {
            value = 0;
        }
    };

    RegisterAction<bit<1>, bit<16>, bit<1>>(down) read_down = {
        void apply(inout bit<1> value, out bit<1> rv) {
            rv = value;
        }
    };

    /* rv = 1 when down was 0: the result is taken (down := 1) */
    RegisterAction<bit<1>, bit<16>, bit<1>>(down) take_down = {
        void apply(inout bit<1> value, out bit<1> rv) {
            rv = ~value;
            value = 1;
        }
    };

    action first()     { meta.path = PATH_FIRST; meta.first = 1; meta.verdict = VERDICT_FIRST; clear_down.execute(meta.cell); }
    action add()       { meta.path = PATH_ADD;   meta.verdict = VERDICT_ADD; }
    action answer()    { meta.path = PATH_READ;  meta.verdict = VERDICT_ANSWER; meta.down = read_down.execute(meta.cell); }
    action result_down()  { meta.path = PATH_DOWN; meta.verdict = VERDICT_RESULT_DOWN; meta.first = take_down.execute(meta.cell); }
    action stale_result() { meta.path = PATH_NONE; meta.verdict = VERDICT_STALE_RESULT; }
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
        actions = { first; add; answer; stale; duplicate; conflict; result_down; stale_result; }
        const default_action = conflict();
        size = 16;   /* first matching row wins */
        const entries = {
            (0, PRED_SAME, _, _, FLAG_RESULT &&& FLAG_RESULT) : result_down();
            (_, _, _, _, FLAG_RESULT &&& FLAG_RESULT)         : stale_result();
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
