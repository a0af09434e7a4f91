/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fakegb10: a STAND-IN for NVIDIA's GB10 driver in the uma.vllm VM lab. No GPU
 * is involved; see fakegb10.c and docs/VM-LAB.md. Userspace interface.
 */
#ifndef FAKEGB10_UAPI_H
#define FAKEGB10_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* flags of struct fakegb10_alloc */
#define FAKEGB10_ALLOC_NO_ZERO   0x1 /* at->flags.zeroed = false: no __GFP_ZERO */
#define FAKEGB10_ALLOC_PAGE_4K   0x2 /* explicit _PAGE_SIZE_4KB: 4K pages, no retry */

struct fakegb10_alloc {
	__u64 size;         /* in: bytes */
	__u32 flags;        /* in: FAKEGB10_ALLOC_* */
	__u32 handle;       /* out: handle for FREE and mmap */
	__u64 page_size;    /* out: page size the allocation got (2M, 64K or 4K) */
	__u64 mmap_offset;  /* out: offset to pass to mmap() */
};

#define FAKEGB10_IOC_ALLOC _IOWR('G', 1, struct fakegb10_alloc)
#define FAKEGB10_IOC_FREE  _IOW('G', 2, __u32)

/* mmap offset of handle h: h << FAKEGB10_MMAP_SHIFT */
#define FAKEGB10_MMAP_SHIFT 40

#endif
