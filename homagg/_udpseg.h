/* UDP segmentation offload (GSO, UDP_SEGMENT) and receive coalescing (GRO, UDP_GRO) for homagg's
 * datagrams, shared by the worker's datapath (homagg/transport/_fastpath.c) and the emulator's
 * native engine (switch_emulator/_dataplane.c).
 *
 * GSO: one sendmsg carries up to hg_gso_max_segments() datagrams of the same length back to back
 * (iovecs in order); the kernel cuts the payload every ``size`` bytes, so every segment is one
 * whole homagg datagram with its own 20-byte header, and it takes the stack (UDP, IP, a veth, a
 * bridge, a qdisc) once for all of them.  The segments that reach the wire or a socket are the
 * datagrams one sendmsg each would have sent, byte for byte.  The kernel refuses it (EIO, EINVAL)
 * where the route's device has no checksum offload or the datagram does not fit its MTU: callers
 * then send one datagram per message and stop trying.
 *
 * GRO: a socket with UDP_GRO set may hand several datagrams of one flow to one recvmsg (a GSO
 * packet that arrived whole, or datagrams the device's GRO merged); the cmsg says the segment
 * size, and hg_gro_size() reads it: the buffer is then datagrams of that size back to back (the
 * last may be shorter).  Without the cmsg the buffer is one datagram.
 *
 * Linux 4.18 (GSO) and 5.0 (GRO); elsewhere the calls fail and the callers fall back as above.
 */
#ifndef HOMAGG_UDPSEG_H
#define HOMAGG_UDPSEG_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

/* control buffer bytes for one UDP_SEGMENT or UDP_GRO value */
#define HG_SEGCTL_LEN CMSG_SPACE(sizeof(int))
/* UDP_MAX_SEGMENTS of Linux 4.18 (later kernels allow more) */
#define HG_GSO_MAX_SEGMENTS 64
/* the largest UDP payload of one IPv4 packet: a GSO message's whole payload must fit */
#define HG_UDP_MAX_PAYLOAD 65507

typedef union {
    struct cmsghdr align;
    uint8_t bytes[HG_SEGCTL_LEN];
} hg_segctl;

/* Datagrams of ``len`` bytes one GSO message may carry (1: GSO brings nothing). */
static inline int hg_gso_max_segments(size_t len) {
    if (len == 0)
        return 1;
    size_t m = HG_UDP_MAX_PAYLOAD / len;
    return m < 1 ? 1 : (m > HG_GSO_MAX_SEGMENTS ? HG_GSO_MAX_SEGMENTS : (int)m);
}

/* Ask for segments of ``size`` bytes on message ``h`` (``ctl`` must outlive the send). */
static inline void hg_gso_set(struct msghdr *h, hg_segctl *ctl, uint16_t size) {
    memset(ctl, 0, sizeof *ctl);
    h->msg_control = ctl->bytes;
    h->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
    struct cmsghdr *cm = CMSG_FIRSTHDR(h);
    cm->cmsg_level = SOL_UDP;
    cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    memcpy(CMSG_DATA(cm), &size, sizeof size);
}

/* Give receive message ``h`` room for the UDP_GRO cmsg. */
static inline void hg_gro_prepare(struct msghdr *h, hg_segctl *ctl) {
    h->msg_control = ctl->bytes;
    h->msg_controllen = sizeof ctl->bytes;
}

/* The segment size of a received buffer (its UDP_GRO cmsg), or 0: one datagram. */
static inline int hg_gro_size(struct msghdr *h) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(h); cm != NULL; cm = CMSG_NXTHDR(h, cm)) {
        if (cm->cmsg_level == SOL_UDP && cm->cmsg_type == UDP_GRO) {
            int size;
            memcpy(&size, CMSG_DATA(cm), sizeof size);
            return size > 0 ? size : 0;
        }
    }
    return 0;
}

#endif
