/* slot_select.p4: the packet's slot must lie in its job's range; pick the register cell.
 *
 * Stage 2 (switch_emulator/slots.py).  cell = 2*slot + bank, other_cell = 2*slot + (1 - bank).
 * The bank (SwitchML's shadow copy) alternates on each reuse of a slot, so a slot's previous
 * result survives in the other bank until every worker has moved on.  Slots are absolute in the
 * pool; the controller never admits a range beyond SLOT_POOL_SIZE.  Outside the range:
 * drop_slot_range.
 */
#ifndef HOMAGG_SLOT_SELECT_P4
#define HOMAGG_SLOT_SELECT_P4

control SlotSelect(inout headers_t hdr, inout metadata_t meta) {
    apply {
        bit<16> slot = (bit<16>) hdr.homagg.slot;
        if (slot < meta.slot_base || slot - meta.slot_base >= meta.n_slots) {
            meta.drop_reason = DROP_SLOT_RANGE;
        } else {
            meta.cell = ((bit<32>) hdr.homagg.slot << 1) | (bit<32>) hdr.homagg.bank;
            meta.other_cell = meta.cell ^ 1;
        }
    }
}

#endif
