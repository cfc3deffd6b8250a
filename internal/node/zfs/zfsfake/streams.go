package zfsfake

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// What streams need of the fake pool (zfs.Streams, zfs.PropertyReader,
// zfs.SnapshotLister, zfs.Holds, zfs.Destroyer), over the same state as
// the rest of the Fake. Fail and Before are consulted with the op names
// "send", "estimate", "receive", "abort_receive", "resume_token", "get",
// "list", "set", "snapshot", "hold", "release", "destroy", "rollback" and
// "rename".

// Write appends token to the content of filesystem fs, as a write to its
// files would: refused with EROFS when it is read-only.
func (f *Fake) Write(fs, token string) error {
	unlock, err := f.enter("write", fs)
	if err != nil {
		return err
	}
	defer unlock()
	e, ok := f.datasets[fs]
	switch {
	case !ok:
		return fmt.Errorf("write to %s: %w", fs, zfs.ErrNotFound)
	case e.ds.Type != zfs.Filesystem:
		return fmt.Errorf("write to %s: snapshots are read-only: %w", fs, syscall.EROFS)
	case e.recv != nil && e.recv.newDataset:
		return fmt.Errorf("write to %s: a partially received filesystem cannot be mounted: %w", fs, zfs.ErrBusy)
	case e.ds.ReadOnly:
		return fmt.Errorf("write to %s: readonly=on: %w", fs, syscall.EROFS)
	}
	e.content = append(e.content, token)
	return nil
}

// Content returns a copy of the tokens written to a filesystem, or frozen
// in a snapshot.
func (f *Fake) Content(name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.datasets[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	return slices.Clone(e.content), nil
}

// checked runs the hooks and checks of op on name, under the lock, for a
// method that does its work later.
func (f *Fake) checked(op, name string) error {
	f.before(op, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.check(op, name)
}

// snapshotsOf returns the snapshots of filesystem fs, oldest first.
func (f *Fake) snapshotsOf(fs string) []*entry {
	var out []*entry
	for n, e := range f.datasets {
		if e.ds.Type == zfs.Snapshot && zfs.Parent(n) == fs {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].createTXG < out[j].createTXG })
	return out
}

// filesystem returns the filesystem fs, or an error wrapping ErrNotFound.
func (f *Fake) filesystem(fs string) (*entry, error) {
	e, ok := f.datasets[fs]
	if !ok || e.ds.Type != zfs.Filesystem {
		return nil, fmt.Errorf("filesystem %s: %w", fs, zfs.ErrNotFound)
	}
	return e, nil
}

// snapshot returns the snapshot name, or an error wrapping ErrNotFound.
func (f *Fake) snapshot(name string) (*entry, error) {
	if !strings.Contains(name, "@") {
		return nil, fmt.Errorf("%q is not a snapshot name", name)
	}
	e, ok := f.datasets[name]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: %w", name, zfs.ErrNotFound)
	}
	return e, nil
}

// onSnapshot runs fn on snapshot name as call op (enter), under the lock;
// a name that is no snapshot's fails with what before the reason
// ("zfs hold tag").
func (f *Fake) onSnapshot(op, name, what string, fn func(e *entry) error) error {
	return f.on(op, name, func(name string) (*entry, error) {
		e, err := f.snapshot(name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return e, nil
	}, fn)
}

// onFilesystem runs fn on filesystem fs as call op (enter), under the
// lock: ErrNotFound when there is none.
func (f *Fake) onFilesystem(op, fs string, fn func(e *entry) error) error {
	return f.on(op, fs, f.filesystem, fn)
}

// ---- Reads ----

func (f *Fake) Snapshots(ctx context.Context, fs string) (out []zfs.Snap, err error) {
	err = f.onFilesystem("list", fs, func(*entry) error {
		for _, e := range f.snapshotsOf(fs) {
			out = append(out, zfs.Snap{Name: e.ds.Name, GUID: e.guid, CreateTXG: e.createTXG, Created: e.ds.Created.Unix(), Deferred: e.ds.DeferDestroy})
		}
		return nil
	})
	return out, err
}

func (f *Fake) Holds(ctx context.Context, fs string) (out map[string][]string, err error) {
	err = f.onFilesystem("list", fs, func(*entry) error {
		out = map[string][]string{}
		for _, e := range f.snapshotsOf(fs) {
			if len(e.holds) > 0 {
				tags := slices.Clone(e.holds)
				sort.Strings(tags)
				out[e.ds.Name] = tags
			}
		}
		return nil
	})
	return out, err
}

func (f *Fake) Property(ctx context.Context, dataset, prop string) (string, error) {
	values, err := f.Properties(ctx, dataset, prop)
	return values[prop], err
}

func (f *Fake) Properties(ctx context.Context, dataset string, props ...string) (values map[string]string, err error) {
	err = f.onDataset("get", dataset, func(e *entry) error {
		values = f.props(e, props)
		return nil
	})
	return values, err
}

func (f *Fake) ChildProperties(ctx context.Context, parent string, props ...string) (out []zfs.Child, err error) {
	err = f.onFilesystem("list", parent, func(*entry) error {
		for n, e := range f.datasets {
			if e.ds.Type == zfs.Filesystem && zfs.Parent(n) == parent {
				out = append(out, zfs.Child{Name: n, Props: f.props(e, props)})
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return nil
	})
	return out, err
}

// props reads properties as zfs get -Hp prints them: "-" when unset or
// not applicable.
func (f *Fake) props(e *entry, props []string) map[string]string {
	out := make(map[string]string, len(props))
	for _, p := range props {
		out[p] = f.prop(e, p)
	}
	return out
}

// nativeDefaults are the values of native properties never set. Neither
// inheritance nor most properties are modelled: others read "-".
var nativeDefaults = map[string]string{"readonly": "off", "canmount": "on", "encryption": "off"}

func (f *Fake) prop(e *entry, p string) string {
	if strings.Contains(p, ":") {
		if v, ok := e.ds.User[p]; ok {
			return v
		}
		return "-"
	}
	snap := e.ds.Type == zfs.Snapshot
	if since, ok := strings.CutPrefix(p, "written@"); ok && !snap {
		return f.writtenSince(e, since)
	}
	switch p {
	case "name":
		return e.ds.Name
	case "type":
		return e.ds.Type.String()
	case "guid":
		return u64(e.guid)
	case "createtxg":
		return u64(e.createTXG)
	case "creation":
		return strconv.FormatInt(e.ds.Created.Unix(), 10)
	case "used":
		return u64(f.view(e).Used)
	case "referenced":
		return u64(f.view(e).Referenced)
	case "available":
		return u64(f.view(e).Available)
	case "origin":
		return orDash(e.ds.Origin)
	case "receive_resume_token":
		if e.recv == nil {
			return "-"
		}
		return e.recv.token.encode()
	case "readonly":
		return onOff(e.ds.ReadOnly)
	}
	if snap {
		switch p {
		case "userrefs":
			return strconv.Itoa(len(e.holds))
		case "defer_destroy":
			return onOff(e.ds.DeferDestroy)
		case "quota", "refquota", "mountpoint", "canmount":
			return "-" // filesystem properties
		}
	} else {
		switch p {
		case "quota":
			return u64(e.ds.Quota)
		case "refquota":
			return u64(e.ds.RefQuota)
		case "mountpoint":
			if v, ok := e.props[p]; ok {
				return v
			}
			return "/" + e.ds.Name // not inherited: the fake has no inheritance
		case "userrefs", "defer_destroy":
			return "-" // snapshot properties
		}
	}
	if v, ok := e.props[p]; ok {
		return v
	}
	if v, ok := nativeDefaults[p]; ok {
		return v
	}
	return "-"
}

// writtenSince is the fake's written@snapshot of the filesystem e: the
// bytes of the tokens written since the snapshot, plus the growth of its
// referenced bytes (SetUsed); "-" when it has no such snapshot.
func (f *Fake) writtenSince(e *entry, snapshot string) string {
	s, ok := f.datasets[e.ds.Name+"@"+snapshot]
	if !ok {
		return "-"
	}
	var n uint64
	for _, token := range e.content[min(len(s.content), len(e.content)):] {
		n += uint64(len(token))
	}
	if e.ds.Referenced > s.ds.Referenced {
		n += e.ds.Referenced - s.ds.Referenced
	}
	return u64(n)
}

func u64(n uint64) string { return strconv.FormatUint(n, 10) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ---- Changes ----

// DestroySnapshot destroys one snapshot, and refuses any other name; a
// held one is ErrBusy.
func (f *Fake) DestroySnapshot(ctx context.Context, snapshot string) error {
	if !strings.Contains(snapshot, "@") {
		return fmt.Errorf("refusing to destroy %q: not a snapshot name", snapshot)
	}
	return f.Destroy(ctx, snapshot)
}

// Hold puts hold tag on snapshot; holding twice is fine.
func (f *Fake) Hold(ctx context.Context, snapshot, tag string) error {
	return f.onSnapshot("hold", snapshot, "zfs hold "+tag, func(e *entry) error {
		if !slices.Contains(e.holds, tag) {
			e.holds = append(e.holds, tag)
		}
		return nil
	})
}

// Release removes hold tag from snapshot; a missing hold is fine.
func (f *Fake) Release(ctx context.Context, snapshot, tag string) error {
	return f.onSnapshot("release", snapshot, "zfs release "+tag, func(e *entry) error {
		e.holds = slices.DeleteFunc(e.holds, func(t string) bool { return t == tag })
		return nil
	})
}

// DestroyRecursive is zfs destroy -r: fs with its snapshots and children.
// Nothing is destroyed when a snapshot among them is held (ErrBusy), or
// has a clone outside them (ErrHasDependents).
func (f *Fake) DestroyRecursive(ctx context.Context, fs string) error {
	// Refused before anything runs, as zfscmd refuses it.
	if strings.Contains(fs, "@") || !strings.Contains(fs, "/") {
		return fmt.Errorf("refusing to destroy %q recursively: not a filesystem below a pool", fs)
	}
	return f.onFilesystem("destroy", fs, func(*entry) error {
		return f.destroyTogether("zfs destroy -r "+fs, f.tree(fs))
	})
}

// destroyTogether destroys the datasets names as one: nothing is destroyed
// when one of them is held (ErrBusy) or has a clone outside them
// (ErrHasDependents). what begins the error ("zfs destroy -r pool/a").
func (f *Fake) destroyTogether(what string, names []string) error {
	in := make(map[string]bool, len(names))
	for _, n := range names {
		in[n] = true
	}
	for _, n := range names {
		if e := f.datasets[n]; len(e.holds) > 0 {
			return fmt.Errorf("%s: %s is held by %v: %w", what, n, e.holds, zfs.ErrBusy)
		}
		var outside []string
		for _, c := range f.clonesOf(n) {
			if !in[c] {
				outside = append(outside, c)
			}
		}
		if len(outside) > 0 {
			return fmt.Errorf("%s: %s has clones %v: %w", what, n, outside, zfs.ErrHasDependents)
		}
	}
	var origins []string
	for _, n := range names {
		origins = append(origins, f.datasets[n].ds.Origin)
		delete(f.datasets, n)
	}
	// A deferred snapshot goes with its last clone, as in ZFS.
	for _, o := range origins {
		if e, ok := f.datasets[o]; ok && e.ds.DeferDestroy && len(f.clonesOf(o)) == 0 {
			delete(f.datasets, o)
		}
	}
	return nil
}

// Rollback is zfs rollback -r: the filesystem's content becomes the
// snapshot's, and the snapshots after it are destroyed; one of them held
// (ErrBusy) or cloned (ErrHasDependents) makes it fail with no change.
func (f *Fake) Rollback(ctx context.Context, snapshot string) error {
	return f.onSnapshot("rollback", snapshot, "zfs rollback", func(to *entry) error {
		fs := f.datasets[zfs.Parent(snapshot)]
		var later []string
		for _, e := range f.snapshotsOf(fs.ds.Name) {
			if e.createTXG > to.createTXG {
				later = append(later, e.ds.Name)
			}
		}
		if err := f.destroyTogether("zfs rollback -r "+snapshot, later); err != nil {
			return err
		}
		fs.content = slices.Clone(to.content)
		fs.ds.Referenced = to.ds.Referenced
		return nil
	})
}

// ---- Streams ----
//
// A stream is what zfs send writes, in miniature:
//
//	a DRR_BEGIN record, 312 bytes, little endian, as OpenZFS writes it
//	    (replication's parseBegin reads it): type 0, magic, versioninfo,
//	    creation time, objset type, toGUID, fromGUID, toName
//	the payload: JSON of streamPayload (the to-snapshot's whole content)
//	a DRR_END record, 312 bytes: type 2; at offset 8, where ZFS has the
//	    stream's checksum, the payload's length; at 40 the toGUID
//
// A stream without its end record was cut short: a receive keeps what came
// as a partial receive, with a resume token.

const (
	recordSize  = 312
	backupMagic = 0x2F5bacbac
	drrBegin    = 0
	drrEnd      = 2
	objsetZFS   = 2
	// versionInfo is that of a plain stream of zfs send -L -c (OpenZFS
	// 2.1): low bits 1, DMU_SUBSTREAM; replication refuses any other.
	versionInfo = 0x01080011
	// Feature flags in versionInfo (DMU_BACKUP_FEATURE_* shifted by 2).
	featureResuming = 1 << 22
	featureRaw      = 1 << 26
	// writeChunk is how much of a stream one Write carries.
	writeChunk = 64 << 10
)

// streamHead is what a begin record says.
type streamHead struct {
	toName   string
	toGUID   uint64
	fromGUID uint64 // 0 for a full stream
	created  int64  // the snapshot's creation time, unix seconds
	raw      bool
	resuming bool // sent from a resume token (zfs send -t)
}

// streamPayload stands for the stream's data records.
type streamPayload struct {
	Content    []string `json:"content"`
	Referenced uint64   `json:"referenced,omitempty"`
	// Encryption is the source's encryption, carried by a raw stream
	// only: its replica stays encrypted.
	Encryption string `json:"encryption,omitempty"`
	// Passphrase stands for the wrapped key a raw stream carries: the
	// replica opens with the source's passphrase.
	Passphrase string `json:"passphrase,omitempty"`
}

func (h streamHead) record() []byte {
	b := make([]byte, recordSize)
	binary.LittleEndian.PutUint32(b[0:], drrBegin)
	binary.LittleEndian.PutUint64(b[8:], backupMagic)
	v := uint64(versionInfo)
	if h.raw {
		v |= featureRaw
	}
	if h.resuming {
		v |= featureResuming
	}
	binary.LittleEndian.PutUint64(b[16:], v)
	binary.LittleEndian.PutUint64(b[24:], uint64(h.created))
	binary.LittleEndian.PutUint32(b[32:], objsetZFS)
	binary.LittleEndian.PutUint64(b[40:], h.toGUID)
	binary.LittleEndian.PutUint64(b[48:], h.fromGUID)
	copy(b[56:recordSize-1], h.toName) // NUL-terminated
	return b
}

func endRecord(toGUID uint64, payloadLen int) []byte {
	b := make([]byte, recordSize)
	binary.LittleEndian.PutUint32(b[0:], drrEnd)
	binary.LittleEndian.PutUint64(b[8:], uint64(payloadLen))
	binary.LittleEndian.PutUint64(b[40:], toGUID)
	return b
}

func encodeStream(h streamHead, payload []byte) []byte {
	out := h.record()
	out = append(out, payload...)
	return append(out, endRecord(h.toGUID, len(payload))...)
}

// decodeStream splits a stream into its head and payload; complete says
// whether it ends with its end record. The payload cannot hold an end
// record by chance: JSON has no NUL bytes.
func decodeStream(b []byte) (h streamHead, payload []byte, complete bool, err error) {
	if len(b) < recordSize {
		return h, nil, false, fmt.Errorf("the stream ends after %d bytes, before its first record", len(b))
	}
	le := binary.LittleEndian
	if le.Uint32(b) != drrBegin || le.Uint64(b[8:]) != backupMagic {
		return h, nil, false, errors.New("bad magic number: not a zfs send stream")
	}
	v := le.Uint64(b[16:])
	if v&3 != 1 {
		return h, nil, false, errors.New("a compound stream (zfs send -R or -p): the fake receives plain streams only")
	}
	name := b[56:recordSize]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	h = streamHead{toName: string(name), toGUID: le.Uint64(b[40:]), fromGUID: le.Uint64(b[48:]),
		created: int64(le.Uint64(b[24:])), raw: v&featureRaw != 0, resuming: v&featureResuming != 0}
	rest := b[recordSize:]
	if len(rest) < recordSize {
		return h, rest, false, nil
	}
	payload, end := rest[:len(rest)-recordSize], rest[len(rest)-recordSize:]
	complete = le.Uint32(end) == drrEnd && le.Uint64(end[40:]) == h.toGUID
	if complete && le.Uint64(end[8:]) != uint64(len(payload)) {
		return h, nil, false, errors.New("checksum mismatch: the payload's length is not the end record's")
	}
	return h, payload, complete, nil
}

// resumeToken is what a receive resume token encodes, as ZFS's do.
type resumeToken struct {
	ToName   string `json:"toname"`
	ToGUID   uint64 `json:"toguid"`
	FromGUID uint64 `json:"fromguid,omitempty"`
	Raw      bool   `json:"raw,omitempty"`
	Bytes    int    `json:"bytes"` // what arrived before the stream broke
}

// tokenPrefix starts every token: real ones start "1-" too.
const tokenPrefix = "1-zfsfake-"

func (t resumeToken) encode() string {
	b, _ := json.Marshal(t) // cannot fail: plain fields
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(s string) (resumeToken, error) {
	var t resumeToken
	b64, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok {
		return t, fmt.Errorf("resume token %q is not one this fake made", s)
	}
	b, err := base64.RawURLEncoding.DecodeString(b64)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err == nil && (t.ToName == "" || t.ToGUID == 0) {
		err = errors.New("no snapshot in it")
	}
	if err != nil {
		return resumeToken{}, fmt.Errorf("resume token is corrupt: %w", err)
	}
	return t, nil
}

// partialRecv is an interrupted zfs receive -s.
type partialRecv struct {
	token resumeToken
	// newDataset: a full stream created the filesystem, which holds
	// nothing yet; aborting the receive removes it.
	newDataset bool
}

func (f *Fake) ResumeToken(ctx context.Context, token string) (zfs.ResumeInfo, error) {
	f.before("resume_token", token)
	if f.Fail != nil {
		if err := f.Fail("resume_token", token); err != nil {
			return zfs.ResumeInfo{}, err
		}
	}
	t, err := decodeToken(token)
	if err != nil {
		return zfs.ResumeInfo{}, err
	}
	return zfs.ResumeInfo{ToName: t.ToName, ToGUID: t.ToGUID, FromGUID: t.FromGUID, Raw: t.Raw}, nil
}

// Send writes the stream spec asks for to w and returns the bytes written.
// The stream is made at once: later changes to the pool do not show in it.
func (f *Fake) Send(ctx context.Context, spec zfs.SendSpec, w io.Writer) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	h, payload, err := f.stream("send", spec)
	if err != nil {
		return 0, err
	}
	return writeStream(ctx, w, encodeStream(h, payload))
}

// EstimateSize returns the size of the payload Send would write.
func (f *Fake) EstimateSize(ctx context.Context, spec zfs.SendSpec) (int64, error) {
	_, payload, err := f.stream("estimate", spec)
	return int64(len(payload)), err
}

// stream builds the head and payload spec asks for.
func (f *Fake) stream(op string, spec zfs.SendSpec) (streamHead, []byte, error) {
	name := spec.Snapshot
	var token resumeToken
	if spec.ResumeToken != "" {
		t, err := decodeToken(spec.ResumeToken)
		if err != nil {
			return streamHead{}, nil, fmt.Errorf("zfs send -t: %w", err)
		}
		token, name = t, t.ToName
	}
	unlock, err := f.enter(op, name)
	if err != nil {
		return streamHead{}, nil, err
	}
	defer unlock()
	if spec.ResumeToken != "" {
		return f.resumeStream(token)
	}
	return f.sendStream(spec.Snapshot, spec.Base, spec.Raw, false)
}

// resumeStream is zfs send -t: the stream the token's receive was
// getting, from scratch (the fake's receive takes a resumed stream whole).
func (f *Fake) resumeStream(t resumeToken) (streamHead, []byte, error) {
	to, ok := f.datasets[t.ToName]
	if !ok || to.ds.Type != zfs.Snapshot || to.guid != t.ToGUID {
		return streamHead{}, nil, fmt.Errorf("zfs send -t: the snapshot %s (guid %d) of the initial send no longer exists: %w", t.ToName, t.ToGUID, zfs.ErrNotFound)
	}
	base := ""
	if t.FromGUID != 0 {
		for _, e := range f.snapshotsOf(zfs.Parent(t.ToName)) {
			if e.guid == t.FromGUID {
				base = e.ds.Name
			}
		}
		if base == "" {
			return streamHead{}, nil, fmt.Errorf("zfs send -t: the incremental source (guid %d) of %s no longer exists: %w", t.FromGUID, t.ToName, zfs.ErrNotFound)
		}
	}
	return f.sendStream(t.ToName, base, t.Raw, true)
}

// sendStream builds the stream of snapshot, incremental from base when
// base is set ("fs@snap" or "@snap").
func (f *Fake) sendStream(snapshot, base string, raw, resuming bool) (streamHead, []byte, error) {
	to, err := f.snapshot(snapshot)
	if err != nil {
		return streamHead{}, nil, fmt.Errorf("zfs send: %w", err)
	}
	fs := zfs.Parent(snapshot)
	h := streamHead{toName: snapshot, toGUID: to.guid, created: to.ds.Created.Unix(), raw: raw, resuming: resuming}
	if base != "" {
		if strings.HasPrefix(base, "@") {
			base = fs + base
		}
		from, ok := f.datasets[base]
		if !ok || from.ds.Type != zfs.Snapshot || zfs.Parent(base) != fs || from.createTXG >= to.createTXG {
			return streamHead{}, nil, fmt.Errorf("zfs send -i %s %s: not an earlier snapshot of %s: %w", base, snapshot, fs, zfs.ErrNotFound)
		}
		h.fromGUID = from.guid
	}
	p := streamPayload{Content: slices.Clone(to.content), Referenced: to.ds.Referenced}
	if enc := f.datasets[fs].props["encryption"]; raw && enc != "" && enc != "off" {
		p.Encryption, p.Passphrase = enc, f.datasets[fs].passphrase
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return streamHead{}, nil, err
	}
	return h, payload, nil
}

// writeStream writes b to w in chunks, stopping when ctx ends, as zfs
// send stops when killed.
func writeStream(ctx context.Context, w io.Writer, b []byte) (int64, error) {
	var n int64
	for len(b) > 0 {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		chunk := b[:min(len(b), writeChunk)]
		m, err := w.Write(chunk)
		n += int64(m)
		if err == nil && m < len(chunk) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return n, fmt.Errorf("zfs send: writing the stream: %w", err)
		}
		b = b[m:]
	}
	return n, nil
}

// Receive is zfs receive -s -u into target, setting props on what it
// creates. A stream cut short, or a ctx that ends while reading (a killed
// zfs receive), leaves a partial receive with a resume token.
func (f *Fake) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	if err := f.checked("receive", target); err != nil {
		return err
	}
	if strings.Contains(target, "@") {
		return fmt.Errorf("zfs receive %s: the target must be a filesystem", target)
	}
	if err := ctx.Err(); err != nil {
		return err // zfs receive would not start
	}
	data, readErr := readStream(ctx, r)
	h, payload, complete, err := decodeStream(data)
	if err != nil {
		return fmt.Errorf("zfs receive %s: invalid stream: %w", target, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.receive(target, props, h, payload, complete && readErr == nil, len(data)); err != nil {
		return fmt.Errorf("zfs receive %s: %w", target, err)
	}
	return nil
}

// readStream reads r to its end, or until ctx ends; it returns what it
// read either way. The reading goroutine stays blocked until r is closed
// when ctx ends first, as the caller's pipe then is.
func readStream(ctx context.Context, r io.Reader) ([]byte, error) {
	chunks := make(chan []byte)
	done := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			buf := make([]byte, writeChunk)
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case chunks <- buf[:n]:
				case <-stop:
					return
				}
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	var data []byte
	for {
		select {
		case c := <-chunks:
			data = append(data, c...)
		case err := <-done: // every chunk was taken before it
			if err == io.EOF {
				return data, nil
			}
			return data, err
		case <-ctx.Done():
			return data, context.Cause(ctx)
		}
	}
}

// receive applies a stream to target; the caller holds the lock.
func (f *Fake) receive(target string, props map[string]string, h streamHead, payload []byte, complete bool, n int) error {
	d := f.datasets[target]
	if err := f.checkReceive(target, d, h); err != nil {
		return err
	}
	if !complete {
		if err := f.interrupt(target, d, props, h, n); err != nil {
			return err
		}
		return fmt.Errorf("cannot receive: failed to read from stream (early EOF), saved a resume token: %w", io.ErrUnexpectedEOF)
	}
	var p streamPayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("invalid stream: bad payload: %w", err)
	}
	if d == nil {
		if err := f.create(target, zfs.Filesystem, "", props); err != nil {
			return err
		}
		d = f.datasets[target]
	} else if err := setProps(d, props); err != nil {
		return err
	}
	if h.fromGUID == 0 && p.Encryption != "" {
		d.props["encryption"], d.passphrase, d.keyLoaded = p.Encryption, p.Passphrase, false
	}
	f.land(d, h, p)
	return nil
}

// checkReceive applies zfs receive's rules before it changes anything.
func (f *Fake) checkReceive(target string, d *entry, h streamHead) error {
	switch {
	case d != nil && d.ds.Type != zfs.Filesystem:
		return fmt.Errorf("destination %s is not a filesystem", target)
	case h.resuming && (d == nil || d.recv == nil):
		return fmt.Errorf("cannot resume: destination %s has no partial receive: %w", target, zfs.ErrNotFound)
	case h.resuming && (d.recv.token.ToGUID != h.toGUID || d.recv.token.FromGUID != h.fromGUID):
		return fmt.Errorf("cannot resume: the stream of %s is not the one the partial receive into %s was getting", h.toName, target)
	case !h.resuming && d != nil && d.recv != nil:
		return fmt.Errorf("destination %s contains partially-complete state from \"zfs receive -s\"", target)
	case h.fromGUID == 0 && d != nil && !h.resuming:
		return fmt.Errorf("destination %s exists: %w", target, zfs.ErrExists)
	case h.fromGUID == 0 && d == nil:
		if p, ok := f.datasets[zfs.Parent(target)]; !ok || p.ds.Type != zfs.Filesystem {
			return fmt.Errorf("parent of %s: %w", target, zfs.ErrNotFound)
		}
		return nil
	case d == nil:
		return fmt.Errorf("destination %s does not exist: %w", target, zfs.ErrNotFound)
	}
	if h.fromGUID != 0 {
		snaps := f.snapshotsOf(target)
		if len(snaps) == 0 || snaps[len(snaps)-1].guid != h.fromGUID {
			return fmt.Errorf("most recent snapshot of %s does not match incremental source", target)
		}
		// Without -F, a write since the newest snapshot makes ZFS refuse.
		if newest := snaps[len(snaps)-1]; !slices.Equal(d.content, newest.content) {
			return fmt.Errorf("destination %s has been modified since most recent snapshot", target)
		}
	}
	if name := target + "@" + shortName(h.toName); f.datasets[name] != nil {
		return fmt.Errorf("destination %s exists: %w", name, zfs.ErrExists)
	}
	return nil
}

// interrupt records a stream cut short: a partial receive.
func (f *Fake) interrupt(target string, d *entry, props map[string]string, h streamHead, n int) error {
	token := resumeToken{ToName: h.toName, ToGUID: h.toGUID, FromGUID: h.fromGUID, Raw: h.raw, Bytes: n}
	switch {
	case d == nil:
		// A full stream into a new filesystem creates it at once, with
		// the properties, and nothing in it yet.
		if err := f.create(target, zfs.Filesystem, "", props); err != nil {
			return err
		}
		f.datasets[target].recv = &partialRecv{token: token, newDataset: true}
	case d.recv != nil: // a resumed stream cut short again
		d.recv.token = token
	default:
		d.recv = &partialRecv{token: token}
	}
	return nil
}

// land completes a receive into filesystem d: the snapshot, with the
// stream's GUID and creation time and the pool's next createtxg; and the
// filesystem's content, now the snapshot's.
func (f *Fake) land(d *entry, h streamHead, p streamPayload) {
	d.recv = nil
	d.content = slices.Clone(p.Content)
	d.ds.Used, d.ds.Referenced = p.Referenced, p.Referenced
	name := d.ds.Name + "@" + shortName(h.toName)
	f.datasets[name] = &entry{
		ds: zfs.Dataset{Name: name, Type: zfs.Snapshot, Created: time.Unix(h.created, 0), Referenced: p.Referenced,
			User: map[string]string{}},
		props: map[string]string{}, guid: h.toGUID, createTXG: f.nextTXG(), content: slices.Clone(p.Content),
	}
}

func shortName(snapshot string) string {
	_, short, _ := strings.Cut(snapshot, "@")
	return short
}

// AbortReceive is zfs receive -A: it discards a partial receive, and the
// filesystem too when a full stream created it.
func (f *Fake) AbortReceive(ctx context.Context, target string) error {
	return f.onFilesystem("abort_receive", target, func(d *entry) error {
		if d.recv == nil {
			return fmt.Errorf("zfs receive -A %s: no partial receive: %w", target, zfs.ErrNotFound)
		}
		if !d.recv.newDataset {
			d.recv = nil
			return nil
		}
		for _, n := range f.tree(target) {
			delete(f.datasets, n)
		}
		return nil
	})
}
