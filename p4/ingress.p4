/* ingress.p4: the ingress pipeline, block by block in the emulator's stage order.
 *
 * admission -> slot_select -> worker_bitmap -> counter -> tree_role -> combine -> replicate (the
 * emulator combines before it counts; both only act on FIRST/ADD verdicts, so the order is
 * immaterial); a result from the job's parent (trees) takes admission -> slot_select ->
 * result_down -> combine (writes the cell) -> replicate.  A stage that decides to drop sets
 * meta.drop_reason and later stages are skipped (replicate counts the drop).
 * Packets not addressed to the aggregation service take the ordinary forwarding path.
 */
#ifndef HOMAGG_INGRESS_P4
#define HOMAGG_INGRESS_P4

control HomaggVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control HomaggIngress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t standard_metadata) {
    Admission()    admission;
    SlotSelect()   slot_select;
    WorkerBitmap() bitmap_check;
    Completion()   completion;
    TreeRole()     tree_role;
    ResultDown()   result_down;
    Combine()      combine;
    Replicate()    replicate;
    Forward()      forward;

    apply {
        meta.drop_reason = DROP_NONE;
        if (hdr.udp.isValid() && hdr.udp.dst_port == HOMAGG_UDP_PORT) {
            admission.apply(hdr, meta, standard_metadata.parser_error);
        }
        if (!meta.to_switch) {
            /* Not addressed to the aggregation service: ordinary forwarding. */
            forward.apply(hdr, meta, standard_metadata);
            return;
        }
        if (meta.drop_reason == DROP_NONE) { slot_select.apply(hdr, meta); }
        if (meta.from_parent) {
            /* trees: a result from the job's parent (tree.p4) */
            if (meta.drop_reason == DROP_NONE) { result_down.apply(hdr, meta); }
        } else {
            if (meta.drop_reason == DROP_NONE) { bitmap_check.apply(hdr, meta); }
            if (meta.drop_reason == DROP_NONE) { completion.apply(hdr, meta); }
            if (meta.drop_reason == DROP_NONE) { tree_role.apply(hdr, meta); }
        }
        if (meta.drop_reason == DROP_NONE) { combine.apply(hdr, meta); }
        replicate.apply(hdr, meta, standard_metadata);
    }
}

#endif
