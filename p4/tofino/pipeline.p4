/* pipeline.p4: the ingress and egress controls, block by block in the emulator's stage order.
 *
 * admission -> worker_bitmap -> use_key -> counter (verdict) -> combine (TOFINO_WORDS Word
 * instances w00 .. w(TOFINO_WORDS - 1), one register each) -> replicate; a stage that decides to
 * drop sets drop_reason and later stages are skipped (replicate counts the drop).  Everything not for the service is
 * forwarded at layer 2.  Egress rewrites results for their worker.
 */
#ifndef HOMAGG_TOFINO_PIPELINE_P4
#define HOMAGG_TOFINO_PIPELINE_P4

/* one Word stage per payload word the program aggregates: w00 .. w(TOFINO_WORDS - 1), from
 * ../words.p4's list, so the registers in bfrt.json, the parser's words (parser.p4) and the
 * stages agree for every TOFINO_WORDS */
#define DECLARE_WORD(NN, I, N) Word() w##NN;
#define APPLY_WORD(NN, I, N) w##NN.apply(hdr.words[I].value, hdr.homagg.op, meta.path, meta.first, meta.cell);

control HomaggIngress(inout tofino_headers_t hdr, inout ig_meta_t meta,
                      in ingress_intrinsic_metadata_t ig_intr_md,
                      in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                      inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                      inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    Admission()    admission;
    WorkerBitmap() bitmap_check;
    UseKey()       use_key;
    Completion()   completion;
    Replicate()    replicate;
    Forward()      forward;
    FOR_FIRST_WORDS(TOFINO_WORDS, DECLARE_WORD)

    apply {
        hdr.bridge.setValid();
        hdr.bridge.kind = BRIDGE_FORWARD;
        hdr.bridge.pad0 = 0;
        hdr.bridge.pad1 = 0;
        hdr.bridge.ingress_port = ig_intr_md.ingress_port;
        if (hdr.udp.isValid() && hdr.udp.dst_port == HOMAGG_UDP_PORT) {
            admission.apply(hdr, meta);
        }
        if (!meta.to_switch) {
            forward.apply(hdr, ig_dprsr_md, ig_tm_md);
        } else {
            bitmap_check.apply(hdr, meta, ig_prsr_md.parser_err);
            if (meta.drop_reason == (bit<8>) DROP_NONE) {
                use_key.apply(hdr, meta);
                completion.apply(hdr, meta);
                FOR_FIRST_WORDS(TOFINO_WORDS, APPLY_WORD)
            }
            replicate.apply(hdr, meta, ig_dprsr_md, ig_tm_md);
        }
    }
}

#undef DECLARE_WORD
#undef APPLY_WORD

control HomaggEgress(inout tofino_headers_t hdr, inout eg_meta_t meta,
                     in egress_intrinsic_metadata_t eg_intr_md,
                     in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                     inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                     inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    ResultRewrite() rewrite;

    apply {
        rewrite.apply(hdr, eg_intr_md, eg_dprsr_md);
    }
}

#endif
