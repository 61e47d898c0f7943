// SPDX-License-Identifier: GPL-2.0
/*
 * A test-only mdev vendor driver shaped like NVIDIA's classic vGPU driver.
 *
 * It binds, as the PCI driver "nvidia", to the display devices qemu emulates
 * in the test VM (bochs-display, 1234:1111) and registers each one as an mdev
 * parent with a few Tesla T4 vGPU types: nvidia-222 "GRID T4-1B",
 * nvidia-223 "GRID T4-2B", nvidia-231 "GRID T4-2Q", described the way
 * NVIDIA describes them.  The driver does its own accounting, as NVIDIA's
 * does: a GPU holds vGPUs of one type at a time (the other types report 0
 * available instances), up to the type's max_instance.  A create beyond
 * that is refused by the probe with -EINVAL (NVIDIA's answer).
 *
 * Each mdev is a VFIO device that qemu can open: a PCI config space that
 * says 10de:1eb8 class 0x0302 (a T4), no BARs, one INTx line never raised,
 * and RESET.  Removing an mdev that qemu holds blocks in the VFIO core
 * until qemu lets go (there is no request callback).
 *
 * Each mdev also migrates (VFIO migration protocol v2, STOP_COPY and P2P,
 * no PRE_COPY): in STOP_COPY its state is
 * read as one small record (a header, the config space, and a test value),
 * and a RESUMING device takes such a record and refuses one made by another
 * type.  The test value is the mdev's sysfs attribute ``test_state`` (a
 * u64, read and written as decimal or 0x-hex): a test sets it on the source
 * vGPU and reads it on the destination's, so it sees that the device's
 * state moved, not that a new device was made.  No dirty-page logging
 * (log_ops): the device never writes guest memory, and the test kernel
 * (no IOMMUFD) could not report it anyway.
 *
 * Written against Linux 6.12 (include/linux/mdev.h, include/linux/vfio.h):
 * ops->release no longer frees the device (the core does).
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/mdev.h>
#include <linux/vfio.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>
#include <linux/anon_inodes.h>
#include <linux/file.h>
#include <linux/fs.h>

#define TGPU_CFG_SIZE		256
#define TGPU_OFFSET_SHIFT	40
#define TGPU_OFFSET_MASK	((1ULL << TGPU_OFFSET_SHIFT) - 1)

struct tgpu_profile {
	const char *sysfs_name;		/* "223" -> type id "nvidia-223" */
	const char *pretty_name;	/* the type's "name" */
	unsigned int num_heads;
	unsigned int frl_config;
	unsigned int framebuffer_mb;
	const char *max_resolution;
	unsigned int max_instance;
};

static const struct tgpu_profile tgpu_profiles[] = {
	{ "222", "GRID T4-1B", 4, 45, 1024, "5120x2880", 16 },
	{ "223", "GRID T4-2B", 4, 45, 2048, "5120x2880", 8 },
	{ "231", "GRID T4-2Q", 4, 60, 2048, "5120x2880", 8 },
};
#define TGPU_NR_TYPES ARRAY_SIZE(tgpu_profiles)

struct tgpu;

/* Each GPU has its own copy: struct mdev_type holds a kobject. */
struct tgpu_type {
	struct mdev_type type;
	const struct tgpu_profile *profile;
	int index;
};

struct tgpu {
	struct mdev_parent parent;
	struct pci_dev *pdev;
	struct mutex lock;		/* active_type, used */
	int active_type;		/* index into tgpu_profiles, -1: none */
	unsigned int used;
	struct tgpu_type types[TGPU_NR_TYPES];
	struct mdev_type *type_ptrs[TGPU_NR_TYPES];
};

/* What one vGPU's migration stream carries (STOP_COPY, one record). */
struct tgpu_mig_record {
	__le64 magic;
#define TGPU_MIG_MAGIC	0x7467707576677075ULL	/* "tgpuvgpu" */
	__le32 version;
#define TGPU_MIG_VERSION 1
	__le32 type_index;
	__le64 test_state;
	u8 config[TGPU_CFG_SIZE];
};

struct tgpu_vgpu;

/* A save (read) or resume (write) file of the migration protocol. */
struct tgpu_mig_file {
	struct file *filp;
	struct mutex lock;		/* everything below */
	struct tgpu_vgpu *vgpu;
	struct tgpu_mig_record rec;
	size_t filled;			/* bytes of rec that hold data */
	bool disabled;
};

struct tgpu_vgpu {
	struct vfio_device vdev;	/* first: vfio_alloc_device() */
	struct tgpu *gpu;
	int type_index;
	u8 config[TGPU_CFG_SIZE];
	u64 test_state;			/* sysfs test_state; migrates */
	struct mutex state_lock;	/* mig_state, the files, test_state */
	enum vfio_device_mig_state mig_state;
	struct tgpu_mig_file *saving;
	struct tgpu_mig_file *resuming;
};

static struct mdev_driver tgpu_mdev_driver;

static struct tgpu *tgpu_of_type(struct mdev_type *mtype)
{
	return container_of(mtype->parent, struct tgpu, parent);
}

static struct tgpu_type *tgpu_type_of(struct mdev_type *mtype)
{
	return container_of(mtype, struct tgpu_type, type);
}

/* -- accounting --------------------------------------------------------- */

static unsigned int tgpu_available(struct tgpu *gpu, int index)
{
	unsigned int max = tgpu_profiles[index].max_instance;

	if (gpu->active_type >= 0 && gpu->active_type != index)
		return 0;
	return gpu->used < max ? max - gpu->used : 0;
}

static int tgpu_take(struct tgpu *gpu, int index)
{
	int ret = 0;

	mutex_lock(&gpu->lock);
	if (tgpu_available(gpu, index) == 0) {
		ret = -EINVAL;
	} else {
		gpu->active_type = index;
		gpu->used++;
	}
	mutex_unlock(&gpu->lock);
	return ret;
}

static void tgpu_give_back(struct tgpu *gpu)
{
	mutex_lock(&gpu->lock);
	if (!WARN_ON(gpu->used == 0) && --gpu->used == 0)
		gpu->active_type = -1;
	mutex_unlock(&gpu->lock);
}

/* -- the emulated PCI function -------------------------------------------- */

static void tgpu_reset_config(struct tgpu_vgpu *vgpu)
{
	u8 *c = vgpu->config;

	memset(c, 0, TGPU_CFG_SIZE);
	*(__le16 *)&c[PCI_VENDOR_ID] = cpu_to_le16(PCI_VENDOR_ID_NVIDIA);
	*(__le16 *)&c[PCI_DEVICE_ID] = cpu_to_le16(0x1eb8);	/* Tesla T4 */
	c[PCI_REVISION_ID] = 0xa1;
	c[PCI_CLASS_PROG] = 0x00;
	*(__le16 *)&c[PCI_CLASS_DEVICE] = cpu_to_le16(PCI_CLASS_DISPLAY_3D);
	c[PCI_HEADER_TYPE] = PCI_HEADER_TYPE_NORMAL;
	*(__le16 *)&c[PCI_SUBSYSTEM_VENDOR_ID] =
		cpu_to_le16(PCI_VENDOR_ID_NVIDIA);
	*(__le16 *)&c[PCI_SUBSYSTEM_ID] = cpu_to_le16(0x12a2);
	c[PCI_INTERRUPT_PIN] = 0;	/* no INTx: nothing to wire up */
}

static ssize_t tgpu_read(struct vfio_device *vdev, char __user *buf,
			 size_t count, loff_t *ppos)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);
	unsigned int index = *ppos >> TGPU_OFFSET_SHIFT;
	u64 pos = *ppos & TGPU_OFFSET_MASK;

	if (index != VFIO_PCI_CONFIG_REGION_INDEX)
		return -EINVAL;
	if (pos >= TGPU_CFG_SIZE)
		return 0;
	count = min_t(size_t, count, TGPU_CFG_SIZE - pos);
	if (copy_to_user(buf, &vgpu->config[pos], count))
		return -EFAULT;
	*ppos += count;
	return count;
}

static ssize_t tgpu_write(struct vfio_device *vdev, const char __user *buf,
			  size_t count, loff_t *ppos)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);
	unsigned int index = *ppos >> TGPU_OFFSET_SHIFT;
	u64 pos = *ppos & TGPU_OFFSET_MASK;
	u8 data[4];

	if (index != VFIO_PCI_CONFIG_REGION_INDEX)
		return -EINVAL;
	if (pos >= TGPU_CFG_SIZE)
		return -EINVAL;
	count = min_t(size_t, count, TGPU_CFG_SIZE - pos);
	/* Only the command register is writable; the rest reads back. */
	if (pos == PCI_COMMAND && count >= 2 && count <= sizeof(data)) {
		if (copy_from_user(data, buf, count))
			return -EFAULT;
		vgpu->config[PCI_COMMAND] = data[0];
		vgpu->config[PCI_COMMAND + 1] = data[1];
	}
	*ppos += count;
	return count;
}

/*
 * The start of the GET_*_INFO ioctls: the caller's struct copied in, and
 * refused when shorter than the fields we fill in (its first field, argsz,
 * in every VFIO struct, says how long it is).
 */
static int tgpu_copy_in(void *info, void __user *arg, unsigned long minsz)
{
	if (copy_from_user(info, arg, minsz))
		return -EFAULT;
	return *(u32 *)info < minsz ? -EINVAL : 0;
}

static long tgpu_get_info(void __user *arg)
{
	unsigned long minsz = offsetofend(struct vfio_device_info, num_irqs);
	struct vfio_device_info info;
	int ret = tgpu_copy_in(&info, arg, minsz);

	if (ret)
		return ret;
	info.flags = VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET;
	info.num_regions = VFIO_PCI_NUM_REGIONS;
	info.num_irqs = VFIO_PCI_NUM_IRQS;
	return copy_to_user(arg, &info, minsz) ? -EFAULT : 0;
}

static long tgpu_get_region_info(void __user *arg)
{
	unsigned long minsz = offsetofend(struct vfio_region_info, offset);
	struct vfio_region_info info;
	int ret = tgpu_copy_in(&info, arg, minsz);

	if (ret)
		return ret;
	if (info.index >= VFIO_PCI_NUM_REGIONS)
		return -EINVAL;
	info.offset = (u64)info.index << TGPU_OFFSET_SHIFT;
	info.cap_offset = 0;
	if (info.index == VFIO_PCI_CONFIG_REGION_INDEX) {
		info.size = TGPU_CFG_SIZE;
		info.flags = VFIO_REGION_INFO_FLAG_READ |
			     VFIO_REGION_INFO_FLAG_WRITE;
	} else {
		info.size = 0;		/* no BARs, no ROM, no VGA */
		info.flags = 0;
	}
	return copy_to_user(arg, &info, minsz) ? -EFAULT : 0;
}

static int tgpu_irq_count(unsigned int index)
{
	return index == VFIO_PCI_INTX_IRQ_INDEX ? 1 : 0;
}

static long tgpu_get_irq_info(void __user *arg)
{
	unsigned long minsz = offsetofend(struct vfio_irq_info, count);
	struct vfio_irq_info info;
	int ret = tgpu_copy_in(&info, arg, minsz);

	if (ret)
		return ret;
	if (info.index >= VFIO_PCI_NUM_IRQS)
		return -EINVAL;
	info.count = tgpu_irq_count(info.index);
	info.flags = info.count ? VFIO_IRQ_INFO_EVENTFD |
				  VFIO_IRQ_INFO_MASKABLE |
				  VFIO_IRQ_INFO_AUTOMASKED : 0;
	return copy_to_user(arg, &info, minsz) ? -EFAULT : 0;
}

static long tgpu_set_irqs(void __user *arg)
{
	unsigned long minsz = offsetofend(struct vfio_irq_set, count);
	struct vfio_irq_set hdr;
	size_t data_size = 0;
	int ret;

	if (copy_from_user(&hdr, arg, minsz))
		return -EFAULT;
	if (hdr.index >= VFIO_PCI_NUM_IRQS)
		return -EINVAL;
	ret = vfio_set_irqs_validate_and_prepare(&hdr,
						 tgpu_irq_count(hdr.index),
						 VFIO_PCI_NUM_IRQS, &data_size);
	/* Accepted and never raised: the device has no interrupt source. */
	return ret;
}

static long tgpu_ioctl(struct vfio_device *vdev, unsigned int cmd,
		       unsigned long arg)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case VFIO_DEVICE_GET_INFO:
		return tgpu_get_info(uarg);
	case VFIO_DEVICE_GET_REGION_INFO:
		return tgpu_get_region_info(uarg);
	case VFIO_DEVICE_GET_IRQ_INFO:
		return tgpu_get_irq_info(uarg);
	case VFIO_DEVICE_SET_IRQS:
		return tgpu_set_irqs(uarg);
	case VFIO_DEVICE_RESET:
		tgpu_reset_config(vgpu);
		return 0;
	}
	return -ENOTTY;
}

/* -- migration (protocol v2, STOP_COPY) ------------------------------------ */

static void tgpu_mig_disable(struct tgpu_mig_file *migf)
{
	mutex_lock(&migf->lock);
	migf->disabled = true;
	migf->filled = 0;
	migf->filp->f_pos = 0;
	mutex_unlock(&migf->lock);
}

/* Drops the device's references to its files (state_lock held). */
static void tgpu_mig_disable_files(struct tgpu_vgpu *vgpu)
{
	if (vgpu->saving) {
		tgpu_mig_disable(vgpu->saving);
		fput(vgpu->saving->filp);
		vgpu->saving = NULL;
	}
	if (vgpu->resuming) {
		tgpu_mig_disable(vgpu->resuming);
		fput(vgpu->resuming->filp);
		vgpu->resuming = NULL;
	}
}

static int tgpu_mig_release(struct inode *inode, struct file *filp)
{
	struct tgpu_mig_file *migf = filp->private_data;

	mutex_destroy(&migf->lock);
	kfree(migf);
	return 0;
}

static ssize_t tgpu_mig_read(struct file *filp, char __user *buf,
			     size_t len, loff_t *pos)
{
	struct tgpu_mig_file *migf = filp->private_data;
	ssize_t ret = 0;

	if (pos)
		return -ESPIPE;
	pos = &filp->f_pos;
	mutex_lock(&migf->lock);
	if (migf->disabled) {
		ret = -ENODEV;
	} else if (*pos > migf->filled) {
		ret = -EINVAL;
	} else {
		len = min_t(size_t, migf->filled - *pos, len);
		if (len && copy_to_user(buf, (u8 *)&migf->rec + *pos, len)) {
			ret = -EFAULT;
		} else {
			*pos += len;
			ret = len;
		}
	}
	mutex_unlock(&migf->lock);
	return ret;
}

static ssize_t tgpu_mig_write(struct file *filp, const char __user *buf,
			      size_t len, loff_t *pos)
{
	struct tgpu_mig_file *migf = filp->private_data;
	loff_t end;
	ssize_t ret;

	if (pos)
		return -ESPIPE;
	pos = &filp->f_pos;
	if (*pos < 0 || check_add_overflow((loff_t)len, *pos, &end))
		return -EINVAL;
	if (end > sizeof(migf->rec))
		return -EFBIG;		/* more than one record: not ours */
	mutex_lock(&migf->lock);
	if (migf->disabled) {
		ret = -ENODEV;
	} else if (copy_from_user((u8 *)&migf->rec + *pos, buf, len)) {
		ret = -EFAULT;
	} else {
		*pos += len;
		migf->filled = max_t(size_t, migf->filled, *pos);
		ret = len;
	}
	mutex_unlock(&migf->lock);
	return ret;
}

static const struct file_operations tgpu_save_fops = {
	.owner = THIS_MODULE,
	.read = tgpu_mig_read,
	.release = tgpu_mig_release,
};

static const struct file_operations tgpu_resume_fops = {
	.owner = THIS_MODULE,
	.write = tgpu_mig_write,
	.release = tgpu_mig_release,
};

static struct tgpu_mig_file *tgpu_mig_open(struct tgpu_vgpu *vgpu,
					   bool save)
{
	struct tgpu_mig_file *migf;

	migf = kzalloc(sizeof(*migf), GFP_KERNEL_ACCOUNT);
	if (!migf)
		return ERR_PTR(-ENOMEM);
	migf->filp = anon_inode_getfile("tgpu_mig",
					save ? &tgpu_save_fops
					     : &tgpu_resume_fops,
					migf, save ? O_RDONLY : O_WRONLY);
	if (IS_ERR(migf->filp)) {
		int ret = PTR_ERR(migf->filp);

		kfree(migf);
		return ERR_PTR(ret);
	}
	stream_open(migf->filp->f_inode, migf->filp);
	mutex_init(&migf->lock);
	migf->vgpu = vgpu;
	if (save) {
		migf->rec.magic = cpu_to_le64(TGPU_MIG_MAGIC);
		migf->rec.version = cpu_to_le32(TGPU_MIG_VERSION);
		migf->rec.type_index = cpu_to_le32(vgpu->type_index);
		migf->rec.test_state = cpu_to_le64(vgpu->test_state);
		memcpy(migf->rec.config, vgpu->config, TGPU_CFG_SIZE);
		migf->filled = sizeof(migf->rec);
	}
	return migf;
}

/* RESUMING -> STOP: the record written must be whole and ours. */
static int tgpu_mig_load(struct tgpu_vgpu *vgpu)
{
	struct tgpu_mig_file *migf = vgpu->resuming;
	int ret = 0;

	mutex_lock(&migf->lock);
	if (migf->filled != sizeof(migf->rec) ||
	    le64_to_cpu(migf->rec.magic) != TGPU_MIG_MAGIC ||
	    le32_to_cpu(migf->rec.version) != TGPU_MIG_VERSION) {
		ret = -EINVAL;
	} else if (le32_to_cpu(migf->rec.type_index) != vgpu->type_index) {
		dev_warn(vgpu->vdev.dev, "migration stream of vGPU type %s "
			 "refused by a %s\n",
			 le32_to_cpu(migf->rec.type_index) < TGPU_NR_TYPES ?
			 tgpu_profiles[le32_to_cpu(migf->rec.type_index)]
				.pretty_name : "?",
			 tgpu_profiles[vgpu->type_index].pretty_name);
		ret = -EINVAL;
	} else {
		vgpu->test_state = le64_to_cpu(migf->rec.test_state);
		memcpy(vgpu->config, migf->rec.config, TGPU_CFG_SIZE);
		/* what the tests read back as "device-state bytes" */
		dev_info(vgpu->vdev.dev, "resumed %zu bytes of device state\n",
			 migf->filled);
	}
	mutex_unlock(&migf->lock);
	return ret;
}

/*
 * STOP -> STOP_COPY (``save``) or STOP -> RESUMING: a new migration file;
 * the device keeps one reference, the caller gets the other.
 */
static struct file *tgpu_mig_start(struct tgpu_vgpu *vgpu, bool save)
{
	struct tgpu_mig_file *migf = tgpu_mig_open(vgpu, save);

	if (IS_ERR(migf))
		return ERR_CAST(migf);
	if (save)
		vgpu->saving = migf;
	else
		vgpu->resuming = migf;
	get_file(migf->filp);
	return migf->filp;
}

/* One arc of the state machine (vfio_mig_get_next_state() splits). */
static struct file *tgpu_mig_step(struct tgpu_vgpu *vgpu,
				  enum vfio_device_mig_state new)
{
	enum vfio_device_mig_state cur = vgpu->mig_state;

	/*
	 * Nothing runs on the device and it does no peer-to-peer DMA:
	 * RUNNING <-> RUNNING_P2P <-> STOP are free.
	 */
	if ((cur == VFIO_DEVICE_STATE_RUNNING &&
	     new == VFIO_DEVICE_STATE_RUNNING_P2P) ||
	    (cur == VFIO_DEVICE_STATE_RUNNING_P2P &&
	     (new == VFIO_DEVICE_STATE_RUNNING ||
	      new == VFIO_DEVICE_STATE_STOP)) ||
	    (cur == VFIO_DEVICE_STATE_STOP &&
	     new == VFIO_DEVICE_STATE_RUNNING_P2P))
		return NULL;
	if (cur == VFIO_DEVICE_STATE_STOP &&
	    new == VFIO_DEVICE_STATE_STOP_COPY)
		return tgpu_mig_start(vgpu, true);
	if (cur == VFIO_DEVICE_STATE_STOP_COPY &&
	    new == VFIO_DEVICE_STATE_STOP) {
		if (vgpu->saving)
			dev_info(vgpu->vdev.dev, "saved %lld bytes of device "
				 "state\n", vgpu->saving->filp->f_pos);
		tgpu_mig_disable_files(vgpu);
		return NULL;
	}
	if (cur == VFIO_DEVICE_STATE_STOP &&
	    new == VFIO_DEVICE_STATE_RESUMING)
		return tgpu_mig_start(vgpu, false);
	if (cur == VFIO_DEVICE_STATE_RESUMING &&
	    new == VFIO_DEVICE_STATE_STOP) {
		int ret = tgpu_mig_load(vgpu);

		if (ret)
			return ERR_PTR(ret);
		tgpu_mig_disable_files(vgpu);
		return NULL;
	}
	WARN_ON(true);		/* no other arc with STOP_COPY | P2P */
	return ERR_PTR(-EINVAL);
}

static struct file *tgpu_set_state(struct vfio_device *vdev,
				   enum vfio_device_mig_state new_state)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);
	struct file *res = NULL;

	mutex_lock(&vgpu->state_lock);
	while (vgpu->mig_state != new_state) {
		enum vfio_device_mig_state next;
		int ret = vfio_mig_get_next_state(vdev, vgpu->mig_state,
						  new_state, &next);

		if (ret) {
			res = ERR_PTR(ret);
			break;
		}
		res = tgpu_mig_step(vgpu, next);
		if (IS_ERR(res))
			break;
		vgpu->mig_state = next;
		if (WARN_ON(res && next != new_state)) {
			fput(res);
			res = ERR_PTR(-EINVAL);
			break;
		}
	}
	mutex_unlock(&vgpu->state_lock);
	return res;
}

static int tgpu_get_state(struct vfio_device *vdev,
			  enum vfio_device_mig_state *state)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);

	mutex_lock(&vgpu->state_lock);
	*state = vgpu->mig_state;
	mutex_unlock(&vgpu->state_lock);
	return 0;
}

static int tgpu_get_data_size(struct vfio_device *vdev,
			      unsigned long *stop_copy_length)
{
	*stop_copy_length = sizeof(struct tgpu_mig_record);
	return 0;
}

static const struct vfio_migration_ops tgpu_mig_ops = {
	.migration_set_state = tgpu_set_state,
	.migration_get_state = tgpu_get_state,
	.migration_get_data_size = tgpu_get_data_size,
};

static int tgpu_open_device(struct vfio_device *vdev)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);

	mutex_lock(&vgpu->state_lock);
	vgpu->mig_state = VFIO_DEVICE_STATE_RUNNING;
	mutex_unlock(&vgpu->state_lock);
	return 0;
}

static void tgpu_close_device(struct vfio_device *vdev)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);

	mutex_lock(&vgpu->state_lock);
	tgpu_mig_disable_files(vgpu);
	mutex_unlock(&vgpu->state_lock);
}

/* 6.12 frees the device itself after this; only our own teardown here. */
static void tgpu_release(struct vfio_device *vdev)
{
	struct tgpu_vgpu *vgpu = container_of(vdev, struct tgpu_vgpu, vdev);

	mutex_destroy(&vgpu->state_lock);
}

static const struct vfio_device_ops tgpu_vfio_ops = {
	.name = "nvidia-tgpu",
	.release = tgpu_release,
	.open_device = tgpu_open_device,
	.close_device = tgpu_close_device,
	.read = tgpu_read,
	.write = tgpu_write,
	.ioctl = tgpu_ioctl,
	/* NULL without CONFIG_IOMMUFD (Debian's 6.12), needed with it */
	.bind_iommufd = vfio_iommufd_emulated_bind,
	.unbind_iommufd = vfio_iommufd_emulated_unbind,
	.attach_ioas = vfio_iommufd_emulated_attach_ioas,
	.detach_ioas = vfio_iommufd_emulated_detach_ioas,
};

/* -- the test's handle on the device state: sysfs test_state ------------- */

static ssize_t test_state_show(struct device *dev,
			       struct device_attribute *attr, char *buf)
{
	struct tgpu_vgpu *vgpu = dev_get_drvdata(dev);
	u64 value;

	if (!vgpu)
		return -ENODEV;
	mutex_lock(&vgpu->state_lock);
	value = vgpu->test_state;
	mutex_unlock(&vgpu->state_lock);
	return sysfs_emit(buf, "0x%llx\n", value);
}

static ssize_t test_state_store(struct device *dev,
				struct device_attribute *attr,
				const char *buf, size_t count)
{
	struct tgpu_vgpu *vgpu = dev_get_drvdata(dev);
	u64 value;
	int ret;

	if (!vgpu)
		return -ENODEV;
	ret = kstrtou64(buf, 0, &value);
	if (ret)
		return ret;
	mutex_lock(&vgpu->state_lock);
	vgpu->test_state = value;
	mutex_unlock(&vgpu->state_lock);
	return count;
}
static DEVICE_ATTR_RW(test_state);

static struct attribute *tgpu_mdev_attrs[] = {
	&dev_attr_test_state.attr,
	NULL,
};
ATTRIBUTE_GROUPS(tgpu_mdev);

/* -- mdev driver ------------------------------------------------------------ */

static int tgpu_mdev_probe(struct mdev_device *mdev)
{
	struct tgpu *gpu = tgpu_of_type(mdev->type);
	struct tgpu_type *type = tgpu_type_of(mdev->type);
	struct tgpu_vgpu *vgpu;
	int ret;

	ret = tgpu_take(gpu, type->index);
	if (ret)
		return ret;
	vgpu = vfio_alloc_device(tgpu_vgpu, vdev, &mdev->dev, &tgpu_vfio_ops);
	if (IS_ERR(vgpu)) {
		tgpu_give_back(gpu);
		return PTR_ERR(vgpu);
	}
	vgpu->gpu = gpu;
	vgpu->type_index = type->index;
	tgpu_reset_config(vgpu);
	mutex_init(&vgpu->state_lock);
	vgpu->mig_state = VFIO_DEVICE_STATE_RUNNING;
	/*
	 * P2P too: QEMU migrates a guest with several VFIO devices only when
	 * all of them support it ("Multiple VFIO devices migration is
	 * supported only if all of them support P2P migration"), and a guest
	 * may hold several vGPUs.
	 */
	vgpu->vdev.migration_flags = VFIO_MIGRATION_STOP_COPY |
				     VFIO_MIGRATION_P2P;
	vgpu->vdev.mig_ops = &tgpu_mig_ops;
	/* before registering: the attribute appears at bind */
	dev_set_drvdata(&mdev->dev, vgpu);
	ret = vfio_register_emulated_iommu_dev(&vgpu->vdev);
	if (ret) {
		dev_set_drvdata(&mdev->dev, NULL);
		vfio_put_device(&vgpu->vdev);
		tgpu_give_back(gpu);
		return ret;
	}
	return 0;
}

static void tgpu_mdev_remove(struct mdev_device *mdev)
{
	struct tgpu_vgpu *vgpu = dev_get_drvdata(&mdev->dev);
	struct tgpu *gpu = vgpu->gpu;

	/* Waits while an opener (qemu) still holds the device. */
	vfio_unregister_group_dev(&vgpu->vdev);
	dev_set_drvdata(&mdev->dev, NULL);
	vfio_put_device(&vgpu->vdev);
	tgpu_give_back(gpu);
}

static unsigned int tgpu_get_available(struct mdev_type *mtype)
{
	struct tgpu *gpu = tgpu_of_type(mtype);
	unsigned int n;

	mutex_lock(&gpu->lock);
	n = tgpu_available(gpu, tgpu_type_of(mtype)->index);
	mutex_unlock(&gpu->lock);
	return n;
}

static ssize_t tgpu_show_description(struct mdev_type *mtype, char *buf)
{
	const struct tgpu_profile *p = tgpu_type_of(mtype)->profile;

	return sysfs_emit(buf,
			  "num_heads=%u, frl_config=%u, framebuffer=%uM, "
			  "max_resolution=%s, max_instance=%u\n",
			  p->num_heads, p->frl_config, p->framebuffer_mb,
			  p->max_resolution, p->max_instance);
}

static struct mdev_driver tgpu_mdev_driver = {
	.device_api = VFIO_DEVICE_API_PCI_STRING,
	.probe = tgpu_mdev_probe,
	.remove = tgpu_mdev_remove,
	.get_available = tgpu_get_available,
	.show_description = tgpu_show_description,
	.driver = {
		.name = "nvidia_vgpu_vfio",
		.owner = THIS_MODULE,
		.mod_name = KBUILD_MODNAME,
		.dev_groups = tgpu_mdev_groups,
	},
};

/* -- PCI driver: one mdev parent per GPU ------------------------------------ */

static int tgpu_pci_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct tgpu *gpu;
	int i, ret;

	gpu = kzalloc(sizeof(*gpu), GFP_KERNEL);
	if (!gpu)
		return -ENOMEM;
	gpu->pdev = pdev;
	gpu->active_type = -1;
	mutex_init(&gpu->lock);
	for (i = 0; i < TGPU_NR_TYPES; i++) {
		gpu->types[i].profile = &tgpu_profiles[i];
		gpu->types[i].index = i;
		gpu->types[i].type.sysfs_name = tgpu_profiles[i].sysfs_name;
		gpu->types[i].type.pretty_name = tgpu_profiles[i].pretty_name;
		gpu->type_ptrs[i] = &gpu->types[i].type;
	}
	ret = mdev_register_parent(&gpu->parent, &pdev->dev, &tgpu_mdev_driver,
				   gpu->type_ptrs, TGPU_NR_TYPES);
	if (ret) {
		kfree(gpu);
		return ret;
	}
	pci_set_drvdata(pdev, gpu);
	dev_info(&pdev->dev, "test vGPU parent with %zu types\n",
		 TGPU_NR_TYPES);
	return 0;
}

static void tgpu_pci_remove(struct pci_dev *pdev)
{
	struct tgpu *gpu = pci_get_drvdata(pdev);

	mdev_unregister_parent(&gpu->parent);
	kfree(gpu);
}

static const struct pci_device_id tgpu_pci_ids[] = {
	{ PCI_DEVICE(0x1234, 0x1111) },	/* qemu bochs-display / VGA */
	{ }
};
MODULE_DEVICE_TABLE(pci, tgpu_pci_ids);

static struct pci_driver tgpu_pci_driver = {
	.name = "nvidia",
	.id_table = tgpu_pci_ids,
	.probe = tgpu_pci_probe,
	.remove = tgpu_pci_remove,
};

static int __init tgpu_init(void)
{
	int ret;

	ret = mdev_register_driver(&tgpu_mdev_driver);
	if (ret)
		return ret;
	ret = pci_register_driver(&tgpu_pci_driver);
	if (ret)
		mdev_unregister_driver(&tgpu_mdev_driver);
	return ret;
}

static void __exit tgpu_exit(void)
{
	pci_unregister_driver(&tgpu_pci_driver);
	mdev_unregister_driver(&tgpu_mdev_driver);
}

module_init(tgpu_init);
module_exit(tgpu_exit);
MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("Test-only mdev driver shaped like NVIDIA's classic vGPU");
