//go:build linux && cgo

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "shim.h"
#include "_cgo_export.h"

int last_errno(libzfs_handle_t *h) { return libzfs_errno(h); }
const char *last_error(libzfs_handle_t *h) { return libzfs_error_description(h); }

nvlist_t *props_new(void) {
	nvlist_t *nv = NULL;
	if (nvlist_alloc(&nv, NV_UNIQUE_NAME, 0) != 0)
		return NULL;
	return nv;
}
int props_add(nvlist_t *nv, const char *k, const char *v) { return nvlist_add_string(nv, k, v); }
void props_free(nvlist_t *nv) { nvlist_free(nv); }

// lookup_string reads string name from nv. OpenZFS 2.2 made the value
// argument of nvlist_lookup_string a const char **, where 2.1's is a
// char **; a void * converts to either, so this compiles on both (GCC 14,
// Debian 13's, refuses the mismatch).
static int lookup_string(nvlist_t *nv, const char *name, const char **value) {
	return nvlist_lookup_string(nv, name, (void *)value);
}

zfs_handle_t *open_dataset(libzfs_handle_t *h, const char *name) {
	return zfs_open(h, name, ZFS_TYPE_FILESYSTEM | ZFS_TYPE_SNAPSHOT | ZFS_TYPE_VOLUME);
}

// go-libzfs converts only native properties to an nvlist; these take user
// properties too, so a dataset is born with its identity.
int create_fs(libzfs_handle_t *h, const char *name, nvlist_t *props) {
	return zfs_create(h, name, ZFS_TYPE_FILESYSTEM, props);
}

int snapshot_one(libzfs_handle_t *h, const char *name, nvlist_t *props) {
	return zfs_snapshot(h, name, B_FALSE, props);
}

int clone_fs(libzfs_handle_t *h, const char *snap, const char *target, nvlist_t *props) {
	zfs_handle_t *zh = zfs_open(h, snap, ZFS_TYPE_SNAPSHOT);
	if (zh == NULL)
		return -1;
	int rc = zfs_clone(zh, target, props);
	zfs_close(zh);
	return rc;
}

// set_props sets every property of props in one call: one sync task for
// all of them, where one zfs_prop_set per property waits for one each.
int set_props(libzfs_handle_t *h, const char *name, nvlist_t *props) {
	zfs_handle_t *zh = open_dataset(h, name);
	if (zh == NULL)
		return -1;
	int rc = zfs_prop_set_list(zh, props);
	zfs_close(zh);
	return rc;
}

// Listings that report failures. go-libzfs's child iteration turns a
// failed zfs_iter_children into "no children", and CI once saw a listing
// miss every snapshot of a dataset that way. Here every failure reaches
// the caller.
//
// A listing runs with the thread's asynchronous signals blocked. OpenZFS
// 2.3's list ioctls stop with EINTR when a signal is pending, and the Go
// runtime signals a thread whose goroutine has run 10 ms without yielding
// (SIGURG): a listing that calls back into Go for each dataset is such a
// goroutine, so a long listing was interrupted again on every retry. A
// blocked signal is not pending for the kernel; it is delivered when the
// listing ends (the runtime ignores a preemption signal that arrives in C).
// Signals that report a fault in this thread stay unblocked.
static void block_signals(sigset_t *saved) {
	sigset_t set;
	sigfillset(&set);
	sigdelset(&set, SIGSEGV);
	sigdelset(&set, SIGBUS);
	sigdelset(&set, SIGFPE);
	sigdelset(&set, SIGILL);
	sigdelset(&set, SIGTRAP);
	sigdelset(&set, SIGABRT);
	pthread_sigmask(SIG_BLOCK, &set, saved);
}

static void restore_signals(const sigset_t *saved) {
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}
typedef struct {
	char *buf;
	size_t len, cap;
	int oom;
	int mode; // list_snapshots: one of the SNAPSHOT_ modes
} lines_t;

static void lines_add(lines_t *l, const char *s) {
	size_t n = strlen(s);
	if (l->len + n + 2 > l->cap) {
		size_t cap = (l->cap + n + 2) * 2;
		char *b = realloc(l->buf, cap);
		if (b == NULL) {
			l->oom = 1;
			return;
		}
		l->buf = b;
		l->cap = cap;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
	l->buf[l->len++] = '\n';
	l->buf[l->len] = 0;
}

// lines_done hands the lines to the caller, or frees them on failure.
static int lines_done(lines_t *l, int rc, char **out) {
	if (rc != 0 || l->oom) {
		free(l->buf);
		return rc != 0 ? rc : -1;
	}
	*out = l->buf;
	return 0;
}

static int collect(zfs_handle_t *zh, void *arg) {
	lines_t *l = arg;
	int rc = 0;
	lines_add(l, zfs_get_name(zh));
	if (zfs_get_type(zh) == ZFS_TYPE_FILESYSTEM) {
		rc = zfs_iter_filesystems(zh, collect, l);
		if (rc == 0)
			rc = zfs_iter_snapshots(zh, B_TRUE, collect, l, 0, 0);
	}
	zfs_close(zh);
	return rc != 0 ? rc : (l->oom ? -1 : 0);
}

// list_tree lists name and every filesystem and snapshot below it.
static int list_tree_unmasked(libzfs_handle_t *h, const char *name, char **out) {
	lines_t l = {0};
	*out = NULL;
	zfs_handle_t *zh = zfs_open(h, name, ZFS_TYPE_FILESYSTEM);
	if (zh == NULL)
		return -1;
	return lines_done(&l, collect(zh, &l), out);
}

int list_tree(libzfs_handle_t *h, const char *name, char **out) {
	sigset_t saved;
	block_signals(&saved);
	int rc = list_tree_unmasked(h, name, out);
	restore_signals(&saved);
	return rc;
}

// One line per snapshot: "name\tguid\tcreatetxg\tcreation\tdefer_destroy"; in
// SNAPSHOT_HOLDS mode one "name\ttag" line per hold instead, in
// SNAPSHOT_NAMES mode the name alone.
static int snapshot_line(zfs_handle_t *zh, void *arg) {
	lines_t *l = arg;
	char line[ZFS_MAX_DATASET_NAME_LEN + 512];
	const char *name = zfs_get_name(zh);
	if (l->mode == SNAPSHOT_NAMES) {
		lines_add(l, name);
	} else if (l->mode == SNAPSHOT_DETAILS) {
		snprintf(line, sizeof(line), "%s\t%llu\t%llu\t%llu\t%d", name,
		    (unsigned long long)zfs_prop_get_int(zh, ZFS_PROP_GUID),
		    (unsigned long long)zfs_prop_get_int(zh, ZFS_PROP_CREATETXG),
		    (unsigned long long)zfs_prop_get_int(zh, ZFS_PROP_CREATION),
		    zfs_prop_get_int(zh, ZFS_PROP_DEFER_DESTROY) != 0);
		lines_add(l, line);
	} else if (zfs_prop_get_int(zh, ZFS_PROP_USERREFS) > 0) {
		nvlist_t *holds = NULL;
		if (zfs_get_holds(zh, &holds) != 0) {
			zfs_close(zh);
			return -1;
		}
		for (nvpair_t *p = nvlist_next_nvpair(holds, NULL); p != NULL; p = nvlist_next_nvpair(holds, p)) {
			snprintf(line, sizeof(line), "%s\t%s", name, nvpair_name(p));
			lines_add(l, line);
		}
		nvlist_free(holds);
	}
	zfs_close(zh);
	return l->oom ? -1 : 0;
}

// list_snapshots lists the snapshots of fs as mode says. For names alone
// the kernel skips reading each snapshot's properties.
static int list_snapshots_unmasked(libzfs_handle_t *h, const char *fs, int mode, char **out) {
	lines_t l = {0};
	l.mode = mode;
	*out = NULL;
	zfs_handle_t *zh = zfs_open(h, fs, ZFS_TYPE_FILESYSTEM | ZFS_TYPE_VOLUME);
	if (zh == NULL)
		return -1;
	int rc = zfs_iter_snapshots(zh, mode == SNAPSHOT_NAMES, snapshot_line, &l, 0, 0);
	zfs_close(zh);
	return lines_done(&l, rc, out);
}

int list_snapshots(libzfs_handle_t *h, const char *fs, int mode, char **out) {
	sigset_t saved;
	block_signals(&saved);
	int rc = list_snapshots_unmasked(h, fs, mode, out);
	restore_signals(&saved);
	return rc;
}

// Listings that hand each dataset's handle, as the iteration made it, to
// the Go side (listed, in libzfs.go) and close it right after: each
// handle carries the statistics and properties the list ioctl returned,
// so reading a thousand datasets costs the listing alone, not a zfs_open
// (one more ioctl) per dataset; and no more than the handles of one path
// down the tree are open at once (holding every handle of a listing
// until its end made a node with a thousand volumes grow by 150 MiB).

// visit_tree hands zh, then the filesystems and snapshots below it, to Go.
// Snapshots are iterated with their properties (not "simple"), since Go
// reads them.
static int visit_tree(zfs_handle_t *zh, void *arg) {
	int rc = 0;
	listed(zh, (uintptr_t)arg);
	if (zfs_get_type(zh) == ZFS_TYPE_FILESYSTEM) {
		rc = zfs_iter_filesystems(zh, visit_tree, arg);
		if (rc == 0)
			rc = zfs_iter_snapshots(zh, B_FALSE, visit_tree, arg, 0, 0);
	}
	zfs_close(zh);
	return rc;
}

static int visit_child(zfs_handle_t *zh, void *arg) {
	if (zfs_get_type(zh) == ZFS_TYPE_FILESYSTEM)
		listed(zh, (uintptr_t)arg);
	zfs_close(zh);
	return 0;
}

// visit_subtree hands name and every filesystem and snapshot below it to Go.
static int visit_subtree_unmasked(libzfs_handle_t *h, const char *name, uintptr_t arg) {
	zfs_handle_t *zh = zfs_open(h, name, ZFS_TYPE_FILESYSTEM);
	if (zh == NULL)
		return -1;
	return visit_tree(zh, (void *)arg);
}

int visit_subtree(libzfs_handle_t *h, const char *name, uintptr_t arg) {
	sigset_t saved;
	block_signals(&saved);
	int rc = visit_subtree_unmasked(h, name, arg);
	restore_signals(&saved);
	return rc;
}

// visit_child_filesystems hands the filesystems directly below parent to Go.
static int visit_child_filesystems_unmasked(libzfs_handle_t *h, const char *parent, uintptr_t arg) {
	zfs_handle_t *zh = zfs_open(h, parent, ZFS_TYPE_FILESYSTEM);
	if (zh == NULL)
		return -1;
	int rc = zfs_iter_filesystems(zh, visit_child, (void *)arg);
	zfs_close(zh);
	return rc;
}

int visit_child_filesystems(libzfs_handle_t *h, const char *parent, uintptr_t arg) {
	sigset_t saved;
	block_signals(&saved);
	int rc = visit_child_filesystems_unmasked(h, parent, arg);
	restore_signals(&saved);
	return rc;
}

// hold_or_release puts tag on snapshot ("fs@snap"), or takes it off.
int hold_or_release(libzfs_handle_t *h, const char *snapshot, const char *tag, int release) {
	char fs[ZFS_MAX_DATASET_NAME_LEN];
	const char *at = strchr(snapshot, '@');
	if (at == NULL || (size_t)(at - snapshot) >= sizeof(fs))
		return -1;
	memcpy(fs, snapshot, at - snapshot);
	fs[at - snapshot] = 0;
	zfs_handle_t *zh = zfs_open(h, fs, ZFS_TYPE_FILESYSTEM | ZFS_TYPE_VOLUME);
	if (zh == NULL)
		return -1;
	int rc = release ? zfs_release(zh, at + 1, tag, B_FALSE) : zfs_hold(zh, at + 1, tag, B_FALSE, -1);
	zfs_close(zh);
	return rc;
}

// prop_get writes a property's parsable value into buf, as `zfs get -Hp`
// prints it: "-" when the property does not apply or a user property is
// unset. Native and user properties alike, and written@snapshot.
void prop_get(zfs_handle_t *zh, const char *name, char *buf, size_t len) {
	if (strncmp(name, "written@", strlen("written@")) == 0) {
		if (zfs_prop_get_written(zh, name, buf, len, B_TRUE) != 0)
			snprintf(buf, len, "-");
		return;
	}
	zfs_prop_t p = zfs_name_to_prop(name);
	if (p != ZPROP_INVAL) {
		if (zfs_prop_get(zh, p, buf, len, NULL, NULL, 0, B_TRUE) != 0)
			snprintf(buf, len, "-");
		return;
	}
	nvlist_t *entry = NULL;
	const char *value = NULL;
	if (nvlist_lookup_nvlist(zfs_get_user_props(zh), name, &entry) == 0 &&
	    lookup_string(entry, ZPROP_VALUE, &value) == 0)
		snprintf(buf, len, "%s", value);
	else
		snprintf(buf, len, "-");
}

// own_user_prop copies a user property set on this dataset itself (locally
// or by a receive) into buf and returns 1; inherited or unset: 0. The
// source test is the one `zfs get` makes.
int own_user_prop(zfs_handle_t *zh, const char *key, char *buf, size_t len) {
	nvlist_t *entry = NULL;
	const char *value = NULL, *source = NULL;
	if (nvlist_lookup_nvlist(zfs_get_user_props(zh), key, &entry) != 0 ||
	    lookup_string(entry, ZPROP_VALUE, &value) != 0 ||
	    lookup_string(entry, ZPROP_SOURCE, &source) != 0)
		return 0;
	if (strcmp(source, zfs_get_name(zh)) != 0 && strcmp(source, ZPROP_SOURCE_VAL_RECVD) != 0)
		return 0;
	snprintf(buf, len, "%s", value);
	return 1;
}

// own_user_props lists the user properties set on dataset name itself
// whose names start with prefix, as lines "name" and "value" in turn, from
// one open; a value with a line break is left out. *out is NULL when
// none matches.
int own_user_props(libzfs_handle_t *h, const char *name, const char *prefix, char **out) {
	zfs_handle_t *zh = open_dataset(h, name);
	if (zh == NULL)
		return -1;
	lines_t l = {0};
	size_t plen = strlen(prefix);
	nvlist_t *props = zfs_get_user_props(zh);
	for (nvpair_t *p = nvlist_next_nvpair(props, NULL); p != NULL; p = nvlist_next_nvpair(props, p)) {
		nvlist_t *entry = NULL;
		const char *value = NULL, *source = NULL;
		if (strncmp(nvpair_name(p), prefix, plen) != 0 || nvpair_value_nvlist(p, &entry) != 0 ||
		    lookup_string(entry, ZPROP_VALUE, &value) != 0 ||
		    lookup_string(entry, ZPROP_SOURCE, &source) != 0)
			continue;
		if (strcmp(source, zfs_get_name(zh)) != 0 && strcmp(source, ZPROP_SOURCE_VAL_RECVD) != 0)
			continue;
		if (strchr(value, '\n') != NULL)
			continue;
		lines_add(&l, nvpair_name(p));
		lines_add(&l, value);
	}
	zfs_close(zh);
	return lines_done(&l, 0, out);
}

// clear_user_prop removes a user property set on dataset name itself, as
// zfs inherit does; one not set there is no error.
int clear_user_prop(libzfs_handle_t *h, const char *name, const char *key) {
	zfs_handle_t *zh = open_dataset(h, name);
	if (zh == NULL)
		return -1;
	int rc = zfs_prop_inherit(zh, key, B_FALSE);
	zfs_close(zh);
	return rc;
}

void read_origin(zfs_handle_t *zh, char *buf, size_t len) {
	if (zfs_get_type(zh) == ZFS_TYPE_SNAPSHOT ||
	    zfs_prop_get(zh, ZFS_PROP_ORIGIN, buf, len, NULL, NULL, 0, B_TRUE) != 0)
		buf[0] = 0;
}

// read_numbers reads from the statistics zfs_open fetched: no further
// ioctls, unlike reading every property by name.
void read_numbers(zfs_handle_t *zh, numbers_t *n) {
	memset(n, 0, sizeof(*n));
	n->type = zfs_get_type(zh);
	n->used = zfs_prop_get_int(zh, ZFS_PROP_USED);
	n->referenced = zfs_prop_get_int(zh, ZFS_PROP_REFERENCED);
	n->creation = zfs_prop_get_int(zh, ZFS_PROP_CREATION);
	n->readonly = zfs_prop_get_int(zh, ZFS_PROP_READONLY);
	n->guid = zfs_prop_get_int(zh, ZFS_PROP_GUID);
	n->createtxg = zfs_prop_get_int(zh, ZFS_PROP_CREATETXG);
	if (n->type == ZFS_TYPE_SNAPSHOT) {
		n->defer_destroy = zfs_prop_get_int(zh, ZFS_PROP_DEFER_DESTROY);
	} else {
		n->available = zfs_prop_get_int(zh, ZFS_PROP_AVAILABLE);
		n->quota = zfs_prop_get_int(zh, ZFS_PROP_QUOTA);
		n->refquota = zfs_prop_get_int(zh, ZFS_PROP_REFQUOTA);
		n->encrypted = zfs_prop_get_int(zh, ZFS_PROP_ENCRYPTION) != ZIO_CRYPT_OFF;
		n->key_loaded = zfs_prop_get_int(zh, ZFS_PROP_KEYSTATUS) == ZFS_KEYSTATUS_AVAILABLE;
		char root[ZFS_MAX_DATASET_NAME_LEN];
		n->encryption_root = n->encrypted &&
		    zfs_prop_get(zh, ZFS_PROP_ENCRYPTION_ROOT, root, sizeof(root), NULL, NULL, 0, B_TRUE) == 0 &&
		    strcmp(root, zfs_get_name(zh)) == 0;
	}
}

// resume_token_info decodes a receive resume token: the snapshot it asks
// for (name and guid), the incremental base's guid (0 for a full stream)
// and whether the stream was raw. -1 if the token does not decode.
int resume_token_info(libzfs_handle_t *h, const char *token, resume_info_t *out) {
	nvlist_t *nv = zfs_send_resume_token_to_nvlist(h, token);
	if (nv == NULL)
		return -1;
	const char *name = NULL;
	int rc = -1;
	if (lookup_string(nv, "toname", &name) == 0 && nvlist_lookup_uint64(nv, "toguid", &out->toguid) == 0 &&
	    strlen(name) < sizeof(out->toname)) {
		strcpy(out->toname, name);
		if (nvlist_lookup_uint64(nv, "fromguid", &out->fromguid) != 0)
			out->fromguid = 0;
		out->raw = nvlist_exists(nv, "rawok");
		rc = 0;
	}
	nvlist_free(nv);
	return rc;
}

// pool_health writes the pool's health ("ONLINE", "DEGRADED", ...) into
// buf; -1 when the pool is not imported. It reads the pool's state from
// the configuration zpool_open_canfail loads: no property is read.
int pool_health(libzfs_handle_t *h, const char *pool, char *buf, size_t len) {
	zpool_handle_t *zp = zpool_open_canfail(h, pool);
	if (zp == NULL)
		return -1;
	int rc = zpool_get_prop(zp, ZPOOL_PROP_HEALTH, buf, len, NULL, B_FALSE);
	zpool_close(zp);
	return rc;
}

// pool_space reads the pool's size, allocated and free bytes (one read of
// the pool's properties); -1 when the pool is not imported.
int pool_space(libzfs_handle_t *h, const char *pool, uint64_t *size, uint64_t *alloc, uint64_t *free) {
	zpool_handle_t *zp = zpool_open_canfail(h, pool);
	if (zp == NULL)
		return -1;
	*size = zpool_get_prop_int(zp, ZPOOL_PROP_SIZE, NULL);
	*alloc = zpool_get_prop_int(zp, ZPOOL_PROP_ALLOCATED, NULL);
	*free = zpool_get_prop_int(zp, ZPOOL_PROP_FREE, NULL);
	zpool_close(zp);
	return 0;
}
