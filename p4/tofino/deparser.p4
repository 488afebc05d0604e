/* deparser.p4: ingress deparser (bridged header first) and egress deparser (IPv4 checksum of
 * results, recomputed after the rewrite, as ../deparser.p4). */
#ifndef HOMAGG_TOFINO_DEPARSER_P4
#define HOMAGG_TOFINO_DEPARSER_P4

control HomaggIngressDeparser(packet_out pkt, inout tofino_headers_t hdr, in ig_meta_t meta,
                              in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

control HomaggEgressDeparser(packet_out pkt, inout tofino_headers_t hdr, in eg_meta_t meta,
                             in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;

    apply {
        if (hdr.homagg.isValid()) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src_addr, hdr.ipv4.dst_addr });
        }
        pkt.emit(hdr);
    }
}

#endif
