/* forward.p4: ordinary L2 forwarding for everything that is not for the aggregation service.
 *
 * l2_forward: Ethernet destination -> output port (installed by the controller from the job /
 * topology description).  Unknown destinations and broadcast (ARP requests) are flooded through
 * FLOOD_GROUP (all ports; egress prunes the ingress port), so ARP and ping work across the switch.
 */
#ifndef HOMAGG_FORWARD_P4
#define HOMAGG_FORWARD_P4

control Forward(inout headers_t hdr, inout metadata_t meta,
                inout standard_metadata_t standard_metadata) {
    action to_port(bit<9> port) {
        standard_metadata.egress_spec = port;
    }

    action flood() {
        standard_metadata.mcast_grp = FLOOD_GROUP;
    }

    action drop() {
        mark_to_drop(standard_metadata);
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
