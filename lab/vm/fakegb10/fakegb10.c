// SPDX-License-Identifier: GPL-2.0
/*
 * fakegb10 - a STAND-IN for NVIDIA's GB10 (DGX Spark) driver, for the uma.vllm
 * VM lab. There is no GPU here. This module only reproduces how NVIDIA's open
 * kernel modules (595.45.04) allocate "device memory" from system memory on a
 * unified-memory GB10, so that a VM with its own kernel sees the same
 * unmovable, unreclaimable, high-order allocations a real rank makes while a
 * checkpoint streams through the page cache. It is not NVIDIA code; the
 * fidelity table in docs/VM-LAB.md maps each step to the real driver's file
 * and line.
 *
 * What it models (references are to NVIDIA/open-gpu-kernel-modules 595.45.04):
 *  - page size: _memmgrPickDefaultSysmemPageSize (mem_mgr.c): GB10B sets
 *    bSysmemPageSizeDefaultAllowLargePages, so an allocation of >= 2 MiB uses
 *    2 MiB pages, >= 64 KiB uses 64 KiB pages, else 4 KiB;
 *  - GFP flags: nv_compute_gfp_mask (nv-vm.c): NV_GFP_KERNEL (GFP_KERNEL |
 *    __GFP_NOWARN) | __GFP_RETRY_MAYFAIL, + __GFP_ZERO when zeroed, +
 *    __GFP_COMP when order > 0;
 *  - nv_alloc_system_pages (nv-vm.c): one __get_free_pages() per page, no
 *    per-page retry; the first failure frees everything (nv_free_system_pages)
 *    and returns NV_ERR_NO_MEMORY;
 *  - sysmemConstruct_IMPL (system_mem.c): on failure the whole allocation is
 *    retried at the next smaller page size (2M -> 64K -> 4K,
 *    _sysmemGetNextSmallestPageSize); at 4K the failure is final and logged
 *    through NV_CHECK_OK_OR_GOTO(LEVEL_ERROR), i.e. nvCheckOkFailedNoLog.
 * Not modelled: the driver's page pool (nv_mem_pool_*), DMA32 limits, NUMA
 * node pinning, confidential computing, GPU mappings.
 *
 * Interface: /dev/fakegb10, ioctl FAKEGB10_IOC_ALLOC / FAKEGB10_IOC_FREE
 * (fakegb10_uapi.h), mmap(offset = handle << 40) to copy bytes in; counters
 * in /sys/class/misc/fakegb10/. Allocations belong to the open file and are
 * freed when it is closed (as an RM client's are when the process exits).
 */
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/idr.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "fakegb10_uapi.h"

#define FG_PAGE_4K  0x1000ULL
#define FG_PAGE_64K 0x10000ULL
#define FG_PAGE_2M  0x200000ULL

enum fg_gfp_mode { FG_GFP_RM = 0, FG_GFP_UVM = 1, FG_GFP_HIGHUSER = 2 };

static int gfp_mode = FG_GFP_RM;
module_param(gfp_mode, int, 0644);
MODULE_PARM_DESC(gfp_mode,
		 "0: RM sysmem (GFP_KERNEL|__GFP_NOWARN|__GFP_RETRY_MAYFAIL, default), "
		 "1: UVM (GFP_KERNEL|__GFP_NOMEMALLOC|__GFP_ZERO), "
		 "2: an older driver's GFP_HIGHUSER|__GFP_NOWARN (0x102cc2 in a published OOM report)");

static bool log_fallbacks = true;
module_param(log_fallbacks, bool, 0644);
MODULE_PARM_DESC(log_fallbacks,
		 "log each retry at a smaller page size (the real driver logs it at LEVEL_INFO, off by default there)");

struct fg_alloc {
	struct kref ref;
	u64 size;
	u64 page_size;
	unsigned int order;
	unsigned long num_pages;   /* pages of page_size */
	unsigned long *virt;       /* one kernel virtual address per page */
};

struct fg_file {
	struct mutex lock;
	struct idr handles;
};

static atomic64_t st_allocs_2m, st_allocs_64k, st_allocs_4k;
static atomic64_t st_fallback_2m, st_fallback_64k, st_failures;
static atomic64_t st_bytes_in_use, st_page_failures[3];

static gfp_t fg_gfp_mask(unsigned int order, bool zeroed)
{
	gfp_t gfp;

	switch (gfp_mode) {
	case FG_GFP_UVM:
		/* uvm_mmu.c phys_mem_allocate_sysmem */
		return GFP_KERNEL | __GFP_NOMEMALLOC | __GFP_ZERO | (order ? __GFP_COMP : 0);
	case FG_GFP_HIGHUSER:
		gfp = GFP_HIGHUSER | __GFP_NOWARN;
		break;
	default:
		/* nv_compute_gfp_mask: NV_GFP_KERNEL, then __GFP_RETRY_MAYFAIL */
		gfp = GFP_KERNEL | __GFP_NOWARN;
		gfp |= __GFP_RETRY_MAYFAIL;
		break;
	}
	if (zeroed)
		gfp |= __GFP_ZERO;
	/* Compound pages are required by vm_insert_page for high-order pages */
	if (order > 0)
		gfp |= __GFP_COMP;
	return gfp;
}

static void fg_free_pages(struct fg_alloc *a)
{
	unsigned long i;

	/* nv_free_system_pages: stop at the first page never allocated */
	for (i = 0; i < a->num_pages; i++) {
		if (a->virt[i] == 0)
			break;
		free_pages(a->virt[i], a->order);
	}
	memset(a->virt, 0, a->num_pages * sizeof(*a->virt));
}

/* nv_alloc_system_pages: all pages of one size, or nothing */
static int fg_alloc_system_pages(struct fg_alloc *a, bool zeroed)
{
	gfp_t gfp = fg_gfp_mask(a->order, zeroed);
	unsigned long i;

	for (i = 0; i < a->num_pages; i++) {
		unsigned long virt_addr = 0;

		if (gfp_mode == FG_GFP_HIGHUSER) {
			/* alloc_pages keeps __GFP_HIGHMEM in the mask the OOM report prints */
			struct page *p = alloc_pages(gfp, a->order);

			if (p)
				virt_addr = (unsigned long)page_address(p);
		} else {
			virt_addr = __get_free_pages(gfp, a->order);
		}
		if (virt_addr == 0)
			goto failed;
		a->virt[i] = virt_addr;
	}
	return 0;

failed:
	fg_free_pages(a);
	return -ENOMEM; /* NV_ERR_NO_MEMORY */
}

static int fg_set_page_size(struct fg_alloc *a, u64 page_size)
{
	unsigned long *virt;

	a->page_size = page_size;
	a->order = get_order(page_size);
	a->num_pages = DIV_ROUND_UP(a->size, page_size);
	virt = kvcalloc(a->num_pages, sizeof(*virt), GFP_KERNEL);
	if (!virt)
		return -ENOMEM;
	kvfree(a->virt);
	a->virt = virt;
	return 0;
}

/* _memmgrPickDefaultSysmemPageSize with bSysmemPageSizeDefaultAllowLargePages */
static u64 fg_default_page_size(u64 size)
{
	if (size >= FG_PAGE_2M)
		return FG_PAGE_2M;
	if (size >= FG_PAGE_64K)
		return FG_PAGE_64K;
	return FG_PAGE_4K;
}

/* _sysmemGetNextSmallestPageSize: 2M -> 64K -> 4K -> stop (0) */
static u64 fg_next_smaller(u64 page_size)
{
	if (page_size == FG_PAGE_2M)
		return FG_PAGE_64K;
	if (page_size == FG_PAGE_64K)
		return FG_PAGE_4K;
	return 0;
}

static int fg_page_index(u64 page_size)
{
	return page_size == FG_PAGE_2M ? 0 : page_size == FG_PAGE_64K ? 1 : 2;
}

/* sysmemConstruct_IMPL: the whole allocation, retried at smaller page sizes */
static struct fg_alloc *fg_construct(u64 size, u32 flags)
{
	bool zeroed = !(flags & FAKEGB10_ALLOC_NO_ZERO);
	bool retry = !(flags & FAKEGB10_ALLOC_PAGE_4K);
	u64 page_size = retry ? fg_default_page_size(size) : FG_PAGE_4K;
	struct fg_alloc *a;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return ERR_PTR(-ENOMEM);
	kref_init(&a->ref);
	a->size = size;
	for (;;) {
		if (fg_set_page_size(a, page_size))
			goto fail;
		if (fg_alloc_system_pages(a, zeroed) == 0)
			break;
		atomic64_inc(&st_page_failures[fg_page_index(page_size)]);
		page_size = retry ? fg_next_smaller(page_size) : 0;
		if (page_size == 0)
			goto fail;
		if (page_size == FG_PAGE_64K)
			atomic64_inc(&st_fallback_2m);
		else
			atomic64_inc(&st_fallback_64k);
		if (log_fallbacks)
			pr_info("NVRM: sysmemConstruct_IMPL: Sysmem alloc failed, retrying with page size 0x%llx.\n",
				page_size);
	}
	if (a->page_size == FG_PAGE_2M)
		atomic64_inc(&st_allocs_2m);
	else if (a->page_size == FG_PAGE_64K)
		atomic64_inc(&st_allocs_64k);
	else
		atomic64_inc(&st_allocs_4k);
	atomic64_add(a->num_pages * a->page_size, &st_bytes_in_use);
	return a;

fail:
	atomic64_inc(&st_failures);
	pr_warn("fakegb10: stand-in for the NVIDIA GB10 driver: %llu-byte sysmem allocation failed at every page size\n",
		size);
	/* the line NV_CHECK_OK_OR_GOTO(..., LEVEL_ERROR, ...) prints at system_mem.c:342 */
	pr_err("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from rmStatus @ system_mem.c:342\n");
	kvfree(a->virt);
	kfree(a);
	return ERR_PTR(-ENOMEM);
}

static void fg_release_alloc(struct kref *ref)
{
	struct fg_alloc *a = container_of(ref, struct fg_alloc, ref);

	atomic64_sub(a->num_pages * a->page_size, &st_bytes_in_use);
	fg_free_pages(a);
	kvfree(a->virt);
	kfree(a);
}

static int fg_open(struct inode *inode, struct file *file)
{
	struct fg_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	idr_init(&f->handles);
	file->private_data = f;
	return 0;
}

static int fg_put_one(int id, void *p, void *data)
{
	kref_put(&((struct fg_alloc *)p)->ref, fg_release_alloc);
	return 0;
}

static int fg_release(struct inode *inode, struct file *file)
{
	struct fg_file *f = file->private_data;

	idr_for_each(&f->handles, fg_put_one, NULL);
	idr_destroy(&f->handles);
	kfree(f);
	return 0;
}

static long fg_ioctl_alloc(struct fg_file *f, void __user *uarg)
{
	struct fakegb10_alloc req;
	struct fg_alloc *a;
	int id;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.size == 0 || req.size > (1ULL << FAKEGB10_MMAP_SHIFT) ||
	    (req.flags & ~(u32)(FAKEGB10_ALLOC_NO_ZERO | FAKEGB10_ALLOC_PAGE_4K)))
		return -EINVAL;
	a = fg_construct(req.size, req.flags);
	if (IS_ERR(a))
		return PTR_ERR(a);
	mutex_lock(&f->lock);
	id = idr_alloc(&f->handles, a, 1, 1 << 22, GFP_KERNEL);
	mutex_unlock(&f->lock);
	if (id < 0) {
		kref_put(&a->ref, fg_release_alloc);
		return id;
	}
	req.handle = id;
	req.page_size = a->page_size;
	req.mmap_offset = (u64)id << FAKEGB10_MMAP_SHIFT;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		mutex_lock(&f->lock);
		idr_remove(&f->handles, id);
		mutex_unlock(&f->lock);
		kref_put(&a->ref, fg_release_alloc);
		return -EFAULT;
	}
	return 0;
}

static long fg_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct fg_file *f = file->private_data;
	struct fg_alloc *a;
	u32 handle;

	switch (cmd) {
	case FAKEGB10_IOC_ALLOC:
		return fg_ioctl_alloc(f, (void __user *)arg);
	case FAKEGB10_IOC_FREE:
		if (get_user(handle, (u32 __user *)arg))
			return -EFAULT;
		mutex_lock(&f->lock);
		a = idr_remove(&f->handles, handle);
		mutex_unlock(&f->lock);
		if (!a)
			return -ENOENT;
		kref_put(&a->ref, fg_release_alloc);
		return 0;
	default:
		return -ENOTTY;
	}
}

static void fg_vma_close(struct vm_area_struct *vma)
{
	kref_put(&((struct fg_alloc *)vma->vm_private_data)->ref, fg_release_alloc);
}

static const struct vm_operations_struct fg_vm_ops = {
	.close = fg_vma_close,
};

static int fg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct fg_file *f = file->private_data;
	unsigned long handle = vma->vm_pgoff >> (FAKEGB10_MMAP_SHIFT - PAGE_SHIFT);
	unsigned long first = vma->vm_pgoff & ((1UL << (FAKEGB10_MMAP_SHIFT - PAGE_SHIFT)) - 1);
	unsigned long npages = vma_pages(vma), sub, i;
	struct fg_alloc *a;
	int ret = 0;

	mutex_lock(&f->lock);
	a = idr_find(&f->handles, handle);
	if (a)
		kref_get(&a->ref);
	mutex_unlock(&f->lock);
	if (!a)
		return -ENOENT;
	sub = a->page_size >> PAGE_SHIFT;
	if (first + npages > a->num_pages * sub) {
		kref_put(&a->ref, fg_release_alloc);
		return -EINVAL;
	}
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP);
#else
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
#endif
	for (i = 0; i < npages && ret == 0; i++) {
		unsigned long idx = first + i;
		unsigned long kva = a->virt[idx / sub] + (idx % sub) * PAGE_SIZE;

		ret = vm_insert_page(vma, vma->vm_start + i * PAGE_SIZE, virt_to_page((void *)kva));
	}
	if (ret) {
		/* the caller unmaps what was inserted; ->close is not called */
		kref_put(&a->ref, fg_release_alloc);
		return ret;
	}
	vma->vm_private_data = a;
	vma->vm_ops = &fg_vm_ops;
	return 0;
}

static const struct file_operations fg_fops = {
	.owner = THIS_MODULE,
	.open = fg_open,
	.release = fg_release,
	.unlocked_ioctl = fg_ioctl,
	.mmap = fg_mmap,
};

#define FG_COUNTER(name, var)							\
	static ssize_t name##_show(struct device *d, struct device_attribute *attr, \
				   char *buf)					\
	{									\
		return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&var));	\
	}									\
	static DEVICE_ATTR_RO(name)

FG_COUNTER(allocs_2m, st_allocs_2m);
FG_COUNTER(allocs_64k, st_allocs_64k);
FG_COUNTER(allocs_4k, st_allocs_4k);
FG_COUNTER(fallbacks_2m_to_64k, st_fallback_2m);
FG_COUNTER(fallbacks_64k_to_4k, st_fallback_64k);
FG_COUNTER(failures, st_failures);
FG_COUNTER(bytes_in_use, st_bytes_in_use);
FG_COUNTER(page_failures_2m, st_page_failures[0]);
FG_COUNTER(page_failures_64k, st_page_failures[1]);
FG_COUNTER(page_failures_4k, st_page_failures[2]);

static ssize_t gfp_mask_show(struct device *d, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "order0=%#x order9=%#x\n", fg_gfp_mask(0, true), fg_gfp_mask(9, true));
}
static DEVICE_ATTR_RO(gfp_mask);

static struct attribute *fg_attrs[] = {
	&dev_attr_allocs_2m.attr,
	&dev_attr_allocs_64k.attr,
	&dev_attr_allocs_4k.attr,
	&dev_attr_fallbacks_2m_to_64k.attr,
	&dev_attr_fallbacks_64k_to_4k.attr,
	&dev_attr_failures.attr,
	&dev_attr_bytes_in_use.attr,
	&dev_attr_page_failures_2m.attr,
	&dev_attr_page_failures_64k.attr,
	&dev_attr_page_failures_4k.attr,
	&dev_attr_gfp_mask.attr,
	NULL,
};
ATTRIBUTE_GROUPS(fg);

static struct miscdevice fg_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "fakegb10",
	.fops = &fg_fops,
	.groups = fg_groups,
	.mode = 0666,
};

static int __init fg_init(void)
{
	int ret = misc_register(&fg_misc);

	if (ret == 0)
		pr_info("fakegb10: stand-in for the NVIDIA GB10 driver's sysmem allocator loaded (no GPU; gfp_mode=%d)\n",
			gfp_mode);
	return ret;
}

static void __exit fg_exit(void)
{
	misc_deregister(&fg_misc);
}

module_init(fg_init);
module_exit(fg_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("STAND-IN for NVIDIA's GB10 driver: its sysmem allocation path only, no GPU (uma.vllm VM lab)");
MODULE_AUTHOR("uma.vllm developers");
