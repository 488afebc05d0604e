/* combine.p4: one register per payload word, indexed by cell.
 *
 * (v1model: ../combine.p4 does a first write, ADD, OR, MAX or a read: five operations on one
 * register, and Tofino allows four RegisterActions per register.)  Here the first write is folded
 * into each combine, as the issue's probe did:
 *   first_or_add : cell := first ? payload : cell + payload     (wrapping)
 *   first_or_or  : cell := first ? payload : cell | payload
 *   first_or_max : cell := first ? payload : signed max(cell, payload)
 *   read         : payload := cell                              (ANSWER)
 * A result from the parent (trees, taken: down was 0) is written with first = 1 by the op's
 * action: cell := payload, returned unchanged into the packet that goes to the members.
 * and each returns the new cell value into the payload word, so the packet that completes a cell
 * carries the result.  The action is chosen by a const table on the counter's access and the op
 * (see the table).
 * Words beyond word_count are invalid headers; their cells get don't-care values that never
 * leave the switch (a use's word_count is part of its key), as in the v1model program.
 */
#ifndef HOMAGG_TOFINO_COMBINE_P4
#define HOMAGG_TOFINO_COMBINE_P4

control Word(inout bit<32> word, in bit<4> op, in bit<3> path, in bit<1> first, in bit<16> cell) {
    Register<bit<32>, bit<16>>(POOL_CELLS) pool;

    RegisterAction<bit<32>, bit<16>, bit<32>>(pool) first_or_add = {
        void apply(inout bit<32> value, out bit<32> result) {
            if (first == 1) {
                value = word;
            } else {
                value = value + word;
            }
            result = value;
        }
    };

    RegisterAction<bit<32>, bit<16>, bit<32>>(pool) first_or_or = {
        void apply(inout bit<32> value, out bit<32> result) {
            if (first == 1) {
                value = word;
            } else {
                value = value | word;
            }
            result = value;
        }
    };

    RegisterAction<int<32>, bit<16>, bit<32>>(pool) first_or_max = {
        void apply(inout int<32> value, out bit<32> result) {
            if (first == 1 || (int<32>) word > value) {
                value = (int<32>) word;
            }
            result = (bit<32>) value;
        }
    };

    RegisterAction<bit<32>, bit<16>, bit<32>>(pool) read = {
        void apply(inout bit<32> value, out bit<32> result) {
            result = value;
        }
    };

    action do_add()  { word = first_or_add.execute(cell); }
    action do_or()   { word = first_or_or.execute(cell); }
    action do_max()  { word = first_or_max.execute(cell); }
    action do_read() { word = read.execute(cell); }

    /* keyed on the verdict's path (counter.p4): PATH_FIRST combines with first = 1 (a write),
     * PATH_ADD combines, PATH_READ reads (ANSWER), PATH_DOWN (trees: a result from the parent)
     * writes the payload with first = 1 (down was 0: taken) and leaves the cell alone with
     * first = 0, PATH_NONE leaves the cell alone */
    table combine {
        key = {
            path  : exact;
            first : exact;
            op    : exact;
        }
        actions = { do_add; do_or; do_max; do_read; NoAction; }
        const default_action = NoAction();
        size = 16;
        const entries = {
            (PATH_FIRST, 1, OP_ADD) : do_add();
            (PATH_FIRST, 1, OP_OR)  : do_or();
            (PATH_FIRST, 1, OP_MAX) : do_max();
            (PATH_ADD, 0, OP_ADD)   : do_add();
            (PATH_ADD, 0, OP_OR)    : do_or();
            (PATH_ADD, 0, OP_MAX)   : do_max();
            (PATH_READ, 0, OP_ADD)  : do_read();
            (PATH_READ, 0, OP_OR)   : do_read();
            (PATH_READ, 0, OP_MAX)  : do_read();
            (PATH_DOWN, 1, OP_ADD)  : do_add();
            (PATH_DOWN, 1, OP_OR)   : do_or();
            (PATH_DOWN, 1, OP_MAX)  : do_max();
        }
    }

    apply {
        combine.apply();
    }
}

#endif
