/* forward.p4: ordinary L2 forwarding for everything that is not for the aggregation service.
 *
 * As ../forward.p4: l2_forward (Ethernet destination -> port); unknown destinations and broadcast
 * are flooded through FLOOD_GROUP (every port; egress prunes the ingress port).
 */
#ifndef HOMAGG_TOFINO_FORWARD_P4
#define HOMAGG_TOFINO_FORWARD_P4

control Forward(inout tofino_headers_t hdr,
                inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    action to_port(PortId_t port) {
        ig_tm_md.ucast_egress_port = port;
    }

    action flood() {
        ig_tm_md.mcast_grp_a = FLOOD_GROUP;
    }

    action drop() {
        ig_dprsr_md.drop_ctl = 1;
    }

    table l2_forward {
        key = { hdr.ethernet.dst_addr : exact; }
        actions = { to_port; flood; drop; }
        default_action = flood();
        size = FORWARD_ENTRIES;
    }

    apply {
        if (hdr.ethernet.isValid()) {
            l2_forward.apply();
        } else {
            drop();
        }
    }
}

#endif
