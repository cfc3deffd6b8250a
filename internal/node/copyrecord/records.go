package copyrecord

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// A node's records of what it promised (docs/safety.md, "Generations")
// and of the snapshots deleted while a node was away (docs/replication.md,
// "Deleted snapshots") are user properties of small datasets beside the
// volumes, under <root>/PromisesDataset, never of the root dataset, whose
// user properties every volume below it would inherit and read at every
// open.

// PromisesDataset is the child of the root dataset under which the
// promise shards live and which holds the deleted-snapshot records; it
// is no volume ID, and holds no data.
const PromisesDataset = "zn-promises"

// PromiseShards is how many datasets share the promise records: a power
// of two, few enough that listing the node's whole tree meets few of
// them, and enough that each holds few records (about 50 with 3000
// volumes in the cluster).
const PromiseShards = 64

// Promise is what a node promised of one volume's generations: its
// record is PropPromisePrefix + the volume ID on PromiseShard, valued
// String().
type Promise struct {
	Generation uint64 // 0: nothing promised
	Holder     string // the node whose copy gets the generation
}

// PromiseProperty is the user property of volume id's promise record.
func PromiseProperty(id string) string { return PropPromisePrefix + id }

// PromiseShard is the dataset holding the promise record of volume id
// under root: the ID ends in hex digits of a hash, spread evenly.
func PromiseShard(root, id string) string {
	n, _ := strconv.ParseUint(id[len(id)-2:], 16, 8)
	return fmt.Sprintf("%s/%s/%02x", root, PromisesDataset, n%PromiseShards)
}

// ParsePromise reads a promise record's value ("GENERATION HOLDER"); an
// unset one ("-", "") or one that is not a generation promises nothing.
func ParsePromise(v string) Promise {
	gen, holder, _ := strings.Cut(v, " ")
	n, err := strconv.ParseUint(gen, 10, 64)
	if err != nil {
		return Promise{}
	}
	return Promise{Generation: n, Holder: holder}
}

func (p Promise) String() string { return strconv.FormatUint(p.Generation, 10) + " " + p.Holder }

// DeletedSnapshot records that every copy of snapshot ID created at or
// before CreatedUnix is deleted: PropDeletedSnapshotPrefix + ID on the
// PromisesDataset, valued String().
type DeletedSnapshot struct {
	ID             string
	SourceVolumeID string
	CreatedUnix    int64
}

func (d DeletedSnapshot) String() string {
	return strconv.FormatInt(d.CreatedUnix, 10) + " " + d.SourceVolumeID
}

// ParseDeletedSnapshot reads the record of snapshot id; false when id is
// no snapshot ID or the value no record ("CREATED_UNIX SOURCE_VOLUME_ID").
func ParseDeletedSnapshot(id, v string) (DeletedSnapshot, bool) {
	created, source, _ := strings.Cut(v, " ")
	n, err := strconv.ParseInt(created, 10, 64)
	if err != nil || !contract.IsSnapshotID(id) {
		return DeletedSnapshot{}, false
	}
	return DeletedSnapshot{ID: id, SourceVolumeID: source, CreatedUnix: n}, true
}
