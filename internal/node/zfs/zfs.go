// Package zfs is the driver's one port to ZFS: what the node's volume
// logic, replication and records need of it, as small interfaces over
// plain Go types.
//
// Two implementations exist: package zfs/libzfs (libzfs through cgo and
// the zfs command for streams and keys, the real thing, linked only into
// zfs-node) and package zfs/zfsfake (in memory, for unit tests of logic
// and the simulations). Nothing above this package knows which one it
// has.
//
// Names are full ZFS names ("tank/volumes/vol-1", "tank/volumes/vol-1@snap").
// Callers validate names before they get here; implementations refuse names
// that are not plain dataset or snapshot names anyway (see ValidateName).
package zfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/zfsname"
)

// Type says whether a dataset is a filesystem or a snapshot. Volumes are
// filesystems; zvols are not used.
type Type int

const (
	Filesystem Type = iota + 1
	Snapshot
)

func (t Type) String() string {
	switch t {
	case Filesystem:
		return "filesystem"
	case Snapshot:
		return "snapshot"
	}
	return fmt.Sprintf("type(%d)", int(t))
}

// PoolSpace is a pool's size and what of it is allocated and free, in
// bytes, as zpool list reports them (raw space: before redundancy).
type PoolSpace struct {
	Size, Allocated, Free uint64
}

// Dataset is what the driver reads about one filesystem or snapshot.
type Dataset struct {
	Name string
	Type Type
	// Used is the space the dataset and its descendants use; for a snapshot,
	// the space only it holds.
	Used uint64
	// Referenced is the data the dataset (or snapshot) refers to.
	Referenced uint64
	// Available is the space left for the dataset, bounded by quotas.
	Available uint64
	// Quota and RefQuota are 0 when unset.
	Quota    uint64
	RefQuota uint64
	Created  time.Time
	// Origin is the snapshot a clone was made from, "" otherwise.
	Origin string
	// DeferDestroy is set on a snapshot whose destroy waits for its clones.
	DeferDestroy bool
	// ReadOnly is the readonly property.
	ReadOnly bool
	// User holds the user properties ("module:name") set locally on the dataset.
	User map[string]string
	// GUID is ZFS's: a snapshot keeps it across send and receive, so two
	// snapshots of one name are the same snapshot only when their GUIDs
	// agree (a stream may bring any name). CreateTXG is the pool's own
	// transaction group that created the dataset here (a received
	// snapshot's is the receive's, whatever the stream says): the lower
	// of two was on the pool first. Both are 0 when not read.
	GUID      uint64
	CreateTXG uint64
	// Encrypted is set on a filesystem whose encryption is not off,
	// KeyRoot when it is its own encryption root (its key is its own,
	// not a parent's or a clone origin's), and KeyLoaded while the key
	// that opens it is loaded (keystatus=available): only then can it be
	// mounted.
	Encrypted bool
	KeyRoot   bool
	KeyLoaded bool
}

// Parent returns the name of the dataset holding name: the filesystem of a
// snapshot, the parent of a filesystem, "" for a pool.
func Parent(name string) string {
	if i := strings.IndexByte(name, '@'); i >= 0 {
		return name[:i]
	}
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return ""
}

// Errors the implementations return, wrapped with detail. Callers test them
// with errors.Is.
var (
	ErrNotFound = errors.New("dataset does not exist")
	ErrExists   = errors.New("dataset already exists")
	// ErrHasDependents: the dataset has snapshots, children or clones.
	ErrHasDependents = errors.New("dataset has dependents")
	// ErrBusy: the dataset is mounted or in use.
	ErrBusy = errors.New("dataset is busy")
	// ErrUnavailable: ZFS itself cannot be used (no /dev/zfs, no pool).
	ErrUnavailable = errors.New("zfs is unavailable")
	// ErrStreamUnsupported: zfs receive refused a stream at its first
	// record because the stream uses a feature this OpenZFS release
	// lacks (a newer release sent it); nothing was received.
	ErrStreamUnsupported = errors.New("the stream uses a ZFS feature this OpenZFS release cannot receive")
	// ErrNoSpace: the pool is full, or a quota of the dataset or one
	// above it is reached; a receive cut by it stays resumable.
	ErrNoSpace = errors.New("no space: the pool is full or a quota is reached")
	// ErrWrongKey: a key did not unlock an encrypted dataset; nothing
	// was loaded.
	ErrWrongKey = errors.New("the key does not unlock the dataset")
)

// The port: what a node needs of ZFS, as small interfaces over the types
// of this package. libzfs implements all of it (Interface), running the
// streams and what takes a key as zfs commands (zfscmd); zfsfake is its
// in-memory fake. Each consumer takes the interfaces it uses.

// Reader reads datasets.
type Reader interface {
	// Get returns one filesystem or snapshot.
	Get(ctx context.Context, name string) (Dataset, error)
	// List returns the filesystem name and everything below it: child
	// filesystems and the snapshots of all of them.
	List(ctx context.Context, name string) ([]Dataset, error)
	// Children returns the filesystems directly below name, without
	// snapshots: much cheaper than List when only those are needed.
	Children(ctx context.Context, name string) ([]Dataset, error)
	// UserProperty reads one user property set on name itself; ok is
	// false when it is not set there. Get reads only the properties the
	// implementation was given; this reads any.
	UserProperty(ctx context.Context, name, key string) (value string, ok bool, err error)
	// OwnUserProperties reads the user properties set on name itself
	// whose keys start with prefix, in one read.
	OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error)
	// SnapshotNames returns the names ("fs@snap") of fs's snapshots,
	// sorted, without reading their properties.
	SnapshotNames(ctx context.Context, fs string) ([]string, error)
}

// Writer changes datasets.
type Writer interface {
	// CreateFilesystem creates name with the given native and user
	// properties set at once, so a crash never leaves it half-labelled.
	CreateFilesystem(ctx context.Context, name string, props map[string]string) error
	// Snapshot creates snapshot name ("fs@snap") with user properties.
	Snapshot(ctx context.Context, name string, props map[string]string) error
	// Clone creates filesystem name from snapshot with properties.
	Clone(ctx context.Context, snapshot, name string, props map[string]string) error
	// SetProperties sets native or user properties.
	SetProperties(ctx context.Context, name string, props map[string]string) error
	// ClearUserProperty removes user property key set on name itself, as
	// zfs inherit does; one not set there is no error.
	ClearUserProperty(ctx context.Context, name, key string) error
	// Rename renames a filesystem, with its snapshots.
	Rename(ctx context.Context, from, to string) error
	// Destroy destroys a filesystem without snapshots or children, or a
	// snapshot without clones. ErrHasDependents otherwise.
	Destroy(ctx context.Context, name string) error
	// DestroyDeferred destroys a snapshot now, or once its last clone is
	// gone (zfs destroy -d).
	DestroyDeferred(ctx context.Context, name string) error
}

// DatasetManager reads and changes datasets under the node's root
// dataset.
type DatasetManager interface {
	Reader
	Writer
	// ReleaseAll removes every user hold from a snapshot.
	ReleaseAll(ctx context.Context, snapshot string) error
}

// PropertyReader reads properties by name as zfs get -Hp prints them
// ("-" when unset or not applicable): what a stream's sender and
// receiver read and compare besides a Dataset's fields.
type PropertyReader interface {
	Property(ctx context.Context, dataset, prop string) (string, error)
	Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error)
	// ChildProperties lists the filesystems directly below parent with
	// props.
	ChildProperties(ctx context.Context, parent string, props ...string) ([]Child, error)
}

// SnapshotLister lists a filesystem's snapshots as streams see them.
type SnapshotLister interface {
	// Snapshots lists the snapshots of fs, oldest first.
	Snapshots(ctx context.Context, fs string) ([]Snap, error)
}

// Holds are user holds on snapshots: a held snapshot is not destroyed.
type Holds interface {
	// Hold puts hold tag on snapshot; holding twice is fine.
	Hold(ctx context.Context, snapshot, tag string) error
	// Release removes hold tag from snapshot; a missing hold is fine.
	Release(ctx context.Context, snapshot, tag string) error
	// Holds returns the hold tags of every snapshot of fs that has any.
	Holds(ctx context.Context, fs string) (map[string][]string, error)
	// ReleaseAll removes every user hold from a snapshot.
	ReleaseAll(ctx context.Context, snapshot string) error
}

// Streams send and receive snapshots between pools.
type Streams interface {
	// Send writes the stream spec names to w and returns its bytes; an
	// error from w stops the sender.
	Send(ctx context.Context, spec SendSpec, w io.Writer) (int64, error)
	// EstimateSize is the size of the stream spec names.
	EstimateSize(ctx context.Context, spec SendSpec) (int64, error)
	// Receive receives the stream r into target, with props set.
	Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error
	// AbortReceive discards the partial receive into target.
	AbortReceive(ctx context.Context, target string) error
	// ResumeToken decodes a receive's resume token.
	ResumeToken(ctx context.Context, token string) (ResumeInfo, error)
}

// Destroyer destroys what streams leave behind: one snapshot (refusing
// any other name), a filesystem with everything below it, and what a
// rollback to a snapshot drops.
type Destroyer interface {
	DestroySnapshot(ctx context.Context, snapshot string) error
	DestroyRecursive(ctx context.Context, fs string) error
	Rollback(ctx context.Context, snapshot string) error
}

// Pools checks the pool under the root dataset.
type Pools interface {
	// PoolHealth returns nil when the pool is imported and ONLINE.
	PoolHealth(ctx context.Context, pool string) error
}

// Encryption creates and copies encrypted filesystems and loads and
// unloads their keys. Every encrypted volume is its own encryption root,
// with keyformat passphrase and keylocation prompt: the key is never
// stored on the node. libzfs takes no key material from its caller (it
// prompts or reads a file), so package zfscmd implements this with the
// zfs command and the passphrase on its standard input.
type Encryption interface {
	// CreateEncrypted creates filesystem name with props, encrypted with
	// passphrase; its key is loaded afterwards.
	CreateEncrypted(ctx context.Context, name string, props map[string]string, passphrase []byte) error
	// CopyEncrypted makes filesystem target, with props, a copy of the
	// encrypted snapshot: its own encryption root with the same key, not
	// a clone (a clone would share its origin's encryption root, whose
	// key it would need loaded), and without the snapshot. No key is
	// loaded.
	CopyEncrypted(ctx context.Context, snapshot, target string, props map[string]string) error
	// LoadKey loads the key of encryption root fs. A key loaded already
	// is no error, and its passphrase is not checked (zfs load-key
	// refuses before it derives one): CheckKey checks it. A wrong
	// passphrase is ErrWrongKey.
	LoadKey(ctx context.Context, fs string, passphrase []byte) error
	// CheckKey checks passphrase against the key of encryption root fs
	// without loading it (zfs load-key -n), whether or not the key is
	// loaded: a wrong one is ErrWrongKey. Nothing changes either way.
	CheckKey(ctx context.Context, fs string, passphrase []byte) error
	// UnloadKey unloads the key of encryption root fs; one not loaded is
	// no error, a mounted fs is ErrBusy.
	UnloadKey(ctx context.Context, fs string) error
}

// Interface is everything a node needs of ZFS.
type Interface interface {
	DatasetManager
	PropertyReader
	SnapshotLister
	Holds
	Streams
	Destroyer
	Pools
	Encryption
}

// ValidateName refuses anything that is not a plain filesystem or snapshot
// name (zfsname.Validate).
var ValidateName = zfsname.Validate

// The vocabulary of replication streams: what to send, what a snapshot
// and a child filesystem are as a stream's sender and receiver read them,
// and what a receive's resume token asks for.

// SendSpec says what to send: a resume token, or a snapshot with an
// optional incremental base.
type SendSpec struct {
	Snapshot    string
	Base        string
	ResumeToken string
	// Raw sends an encrypted dataset's blocks as stored (-w): the stream and
	// the replica stay encrypted, and the receiver needs no key.
	Raw bool
}

// ResumeInfo is what a receive resume token asks the sender to send.
type ResumeInfo struct {
	ToName   string // the snapshot, full name
	ToGUID   uint64
	FromGUID uint64 // the incremental base; 0 for a full stream
	Raw      bool   // the stream was raw (-w)
}

// Child is a filesystem directly below a parent, with requested properties.
type Child struct {
	Name  string
	Props map[string]string
}

// Snap is one snapshot as replication sees it.
type Snap struct {
	Name      string // full name
	GUID      uint64
	CreateTXG uint64
	Created   int64 // unix seconds
	// Deferred: destroyed with zfs destroy -d while clones or holds kept
	// it; ZFS removes it with the last of them. A CSI snapshot deferred
	// so is deleted: it is never sent (docs/replication.md, "CSI
	// snapshots").
	Deferred bool
}
