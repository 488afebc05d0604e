/* pipeline.p4: the ingress and egress controls, block by block in the emulator's stage order.
 *
 * admission -> worker_bitmap -> use_key -> counter (verdict) -> combine (TOFINO_WORDS Word
 * instances, one register each) -> replicate; a stage that decides to drop sets drop_reason and
 * later stages are skipped (replicate counts the drop).  Everything not for the service is
 * forwarded at layer 2.  Egress rewrites results for their worker.
 */
#ifndef HOMAGG_TOFINO_PIPELINE_P4
#define HOMAGG_TOFINO_PIPELINE_P4

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
    Word() w00;
    Word() w01;
    Word() w02;
    Word() w03;
    Word() w04;
    Word() w05;
    Word() w06;
    Word() w07;
    Word() w08;
    Word() w09;
    Word() w10;
    Word() w11;
    Word() w12;
    Word() w13;
    Word() w14;
    Word() w15;
#if TOFINO_WORDS > 16
    Word() w16;
#endif
#if TOFINO_WORDS > 17
    Word() w17;
#endif
#if TOFINO_WORDS > 18
    Word() w18;
#endif
#if TOFINO_WORDS > 19
    Word() w19;
#endif
#if TOFINO_WORDS > 20
    Word() w20;
#endif
#if TOFINO_WORDS > 21
    Word() w21;
#endif
#if TOFINO_WORDS > 22
    Word() w22;
#endif
#if TOFINO_WORDS > 23
    Word() w23;
#endif
#if TOFINO_WORDS > 24
    Word() w24;
#endif
#if TOFINO_WORDS > 25
    Word() w25;
#endif
#if TOFINO_WORDS > 26
    Word() w26;
#endif
#if TOFINO_WORDS > 27
    Word() w27;
#endif
#if TOFINO_WORDS > 28
    Word() w28;
#endif
#if TOFINO_WORDS > 29
    Word() w29;
#endif
#if TOFINO_WORDS > 30
    Word() w30;
#endif
#if TOFINO_WORDS > 31
    Word() w31;
#endif

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
            w00.apply(hdr.words[0].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w01.apply(hdr.words[1].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w02.apply(hdr.words[2].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w03.apply(hdr.words[3].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w04.apply(hdr.words[4].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w05.apply(hdr.words[5].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w06.apply(hdr.words[6].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w07.apply(hdr.words[7].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w08.apply(hdr.words[8].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w09.apply(hdr.words[9].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w10.apply(hdr.words[10].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w11.apply(hdr.words[11].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w12.apply(hdr.words[12].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w13.apply(hdr.words[13].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w14.apply(hdr.words[14].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
            w15.apply(hdr.words[15].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#if TOFINO_WORDS > 16
            w16.apply(hdr.words[16].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 17
            w17.apply(hdr.words[17].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 18
            w18.apply(hdr.words[18].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 19
            w19.apply(hdr.words[19].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 20
            w20.apply(hdr.words[20].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 21
            w21.apply(hdr.words[21].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 22
            w22.apply(hdr.words[22].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 23
            w23.apply(hdr.words[23].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 24
            w24.apply(hdr.words[24].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 25
            w25.apply(hdr.words[25].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 26
            w26.apply(hdr.words[26].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 27
            w27.apply(hdr.words[27].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 28
            w28.apply(hdr.words[28].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 29
            w29.apply(hdr.words[29].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 30
            w30.apply(hdr.words[30].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
#if TOFINO_WORDS > 31
            w31.apply(hdr.words[31].value, hdr.homagg.op, meta.path, meta.first, meta.cell);
#endif
            }
            replicate.apply(hdr, meta, ig_dprsr_md, ig_tm_md);
        }
    }
}

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
