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
 * Written against Linux 6.1 (include/linux/mdev.h, include/linux/vfio.h).
 */
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/mdev.h>
#include <linux/vfio.h>
#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>

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

struct tgpu_vgpu {
	struct vfio_device vdev;	/* first: vfio_alloc_device() */
	struct tgpu *gpu;
	int type_index;
	u8 config[TGPU_CFG_SIZE];
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

/* 6.1 calls ops->release unconditionally: it must free the device. */
static void tgpu_release(struct vfio_device *vdev)
{
	vfio_free_device(vdev);
}

static const struct vfio_device_ops tgpu_vfio_ops = {
	.name = "nvidia-tgpu",
	.release = tgpu_release,
	.read = tgpu_read,
	.write = tgpu_write,
	.ioctl = tgpu_ioctl,
};

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
	ret = vfio_register_emulated_iommu_dev(&vgpu->vdev);
	if (ret) {
		vfio_put_device(&vgpu->vdev);
		tgpu_give_back(gpu);
		return ret;
	}
	dev_set_drvdata(&mdev->dev, vgpu);
	return 0;
}

static void tgpu_mdev_remove(struct mdev_device *mdev)
{
	struct tgpu_vgpu *vgpu = dev_get_drvdata(&mdev->dev);
	struct tgpu *gpu = vgpu->gpu;

	/* Waits while an opener (qemu) still holds the device. */
	vfio_unregister_group_dev(&vgpu->vdev);
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
