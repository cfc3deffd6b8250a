// The C side of package libzfs: small wrappers around libzfs calls that
// cgo cannot make directly, or that would take many crossings one by one.
// Each call is given a libzfs handle no other goroutine is using (see
// libzfs.go).
#ifndef ZFS_NOMAD_LIBZFS_SHIM_H
#define ZFS_NOMAD_LIBZFS_SHIM_H

#include <stdlib.h>
#include <libzfs.h>
#include <libnvpair.h>

int last_errno(libzfs_handle_t *h);
int pool_health(libzfs_handle_t *h, const char *pool, char *buf, size_t len);
int pool_space(libzfs_handle_t *h, const char *pool, uint64_t *size, uint64_t *alloc, uint64_t *free);
const char *last_error(libzfs_handle_t *h);

nvlist_t *props_new(void);
int props_add(nvlist_t *nv, const char *k, const char *v);
void props_free(nvlist_t *nv);

int create_fs(libzfs_handle_t *h, const char *name, nvlist_t *props);
int snapshot_one(libzfs_handle_t *h, const char *name, nvlist_t *props);
int clone_fs(libzfs_handle_t *h, const char *snap, const char *target, nvlist_t *props);
int set_props(libzfs_handle_t *h, const char *name, nvlist_t *props);

// Listings: one line per entry in *out, freed by the caller.
int list_tree(libzfs_handle_t *h, const char *name, char **out);
enum { SNAPSHOT_DETAILS, SNAPSHOT_HOLDS, SNAPSHOT_NAMES };
int list_snapshots(libzfs_handle_t *h, const char *fs, int mode, char **out);
// Listings that hand each dataset's handle to the Go side's listed, with
// arg, during the iteration.
int visit_subtree(libzfs_handle_t *h, const char *name, uintptr_t arg);
int visit_child_filesystems(libzfs_handle_t *h, const char *parent, uintptr_t arg);

int hold_or_release(libzfs_handle_t *h, const char *snapshot, const char *tag, int release);

// What a receive resume token asks the sender for (libzfs decodes it).
typedef struct {
	char toname[ZFS_MAX_DATASET_NAME_LEN];
	uint64_t toguid, fromguid;
	int raw;
} resume_info_t;
int resume_token_info(libzfs_handle_t *h, const char *token, resume_info_t *out);

zfs_handle_t *open_dataset(libzfs_handle_t *h, const char *name);
void prop_get(zfs_handle_t *zh, const char *name, char *buf, size_t len);
int own_user_prop(zfs_handle_t *zh, const char *key, char *buf, size_t len);
int own_user_props(libzfs_handle_t *h, const char *name, const char *prefix, char **out);
int clear_user_prop(libzfs_handle_t *h, const char *name, const char *key);
void read_origin(zfs_handle_t *zh, char *buf, size_t len);

// The numbers zfs.Dataset needs, all from the statistics zfs_open read.
typedef struct {
	int type;
	uint64_t used, referenced, available, quota, refquota, creation, defer_destroy, readonly, guid, createtxg;
	int encrypted, key_loaded, encryption_root;
} numbers_t;
void read_numbers(zfs_handle_t *zh, numbers_t *n);

#endif
