// Package volumelog names volumes on log lines. A line about a volume
// carries its ID (volume_id, in the line's arguments or its logger's);
// an operator searches by the name Nomad shows. Rather than each of the
// hundred lines that name an ID also looking its name up, the loggers
// the binaries make (csiplugin.NewLogger) add volume_name to every line
// with a volume_id whose name the process has learned: where a volume's
// name and ID are read together (a node's datasets, an agent's answer, a
// create's request), the reader calls Learn.
package volumelog

import (
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// The keys this package reads and writes on a line.
const (
	KeyID   = "volume_id"
	KeyName = "volume_name"
)

// names maps a volume ID to its name, for the whole process. It holds
// a short string per volume ever seen, as the process's other caches do.
var names sync.Map

// Learn records that the volume id is named name. An ID is derived from
// its name (contract.VolumeIDForName), so a pair that does not match, as
// a peer or a stale record might give, is ignored: no line ever names
// the wrong volume.
func Learn(id, name string) {
	if old, ok := names.Load(id); ok && old == name {
		return
	}
	if id == "" || name == "" || contract.VolumeIDForName(name) != id {
		return
	}
	names.Store(id, name)
}

// Name returns the name learned for id.
func Name(id string) (string, bool) {
	v, ok := names.Load(id)
	if !ok {
		return "", false
	}
	return v.(string), true
}

// Logger returns l, and every logger derived from it (With, Named),
// adding volume_name to each line that names a volume_id with a learned
// name and no volume_name of its own or its logger's.
func Logger(l hclog.Logger) hclog.Logger {
	if n, ok := l.(naming); ok {
		return n
	}
	return naming{Logger: l}
}

// naming wraps a logger; id is the volume_id among its implied
// arguments, if any, and named whether those hold a volume_name.
type naming struct {
	hclog.Logger
	id    string
	named bool
}

func (l naming) Log(level hclog.Level, msg string, args ...any) {
	l.Logger.Log(level, msg, l.withName(args)...)
}
func (l naming) Trace(msg string, args ...any) { l.Logger.Trace(msg, l.withName(args)...) }
func (l naming) Debug(msg string, args ...any) { l.Logger.Debug(msg, l.withName(args)...) }
func (l naming) Info(msg string, args ...any)  { l.Logger.Info(msg, l.withName(args)...) }
func (l naming) Warn(msg string, args ...any)  { l.Logger.Warn(msg, l.withName(args)...) }
func (l naming) Error(msg string, args ...any) { l.Logger.Error(msg, l.withName(args)...) }

func (l naming) With(args ...any) hclog.Logger {
	id, hasID := value(args, KeyID)
	_, hasName := value(args, KeyName)
	n := naming{Logger: l.Logger.With(args...), id: l.id, named: l.named || hasName}
	if hasID {
		n.id = id
	}
	return n
}

func (l naming) Named(name string) hclog.Logger {
	return naming{Logger: l.Logger.Named(name), id: l.id, named: l.named}
}

func (l naming) ResetNamed(name string) hclog.Logger {
	return naming{Logger: l.Logger.ResetNamed(name), id: l.id, named: l.named}
}

// withName returns args with the volume's name added, when the line or
// the logger names a volume whose name is known and neither names it.
func (l naming) withName(args []any) []any {
	if l.named || len(args)%2 == 1 { // an odd list ends in a value hclog reports alone: leave it be
		return args
	}
	if _, ok := value(args, KeyName); ok {
		return args
	}
	id, ok := value(args, KeyID)
	if !ok {
		id = l.id
	}
	name, ok := Name(id)
	if !ok {
		return args
	}
	return append(args[:len(args):len(args)], KeyName, name)
}

// value returns the string value of key among args' key-value pairs.
func value(args []any, key string) (string, bool) {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == key {
			s, ok := args[i+1].(string)
			return s, ok && s != ""
		}
	}
	return "", false
}
