package zfscmd

import (
	"errors"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// TestClassify: zfs's messages become the error kinds callers act on. The
// stderr texts are those OpenZFS 2.1 to 2.3 print.
func TestClassify(t *testing.T) {
	tests := []struct {
		stderr string
		want   error
	}{
		{"cannot open 'p/x': dataset does not exist", zfs.ErrNotFound},
		{"cannot create 'p/x': dataset already exists", zfs.ErrExists},
		{"cannot receive: stream has unsupported feature, feature flags = 0x10000004", zfs.ErrStreamUnsupported},
		// What a corrupted stream gets from the kernel too: not a newer
		// release's stream, but a broken one (resumable, Aborted).
		{"cannot receive incremental stream: kernel modules must be upgraded to receive this stream.", nil},
		{"cannot destroy 'p/x': dataset is busy", nil},
		{"cannot receive incremental stream: destination p/x space quota exceeded.", zfs.ErrNoSpace},
		{"cannot receive new filesystem stream: out of space", zfs.ErrNoSpace},
		// zfs load-key, and load-key -n (CheckKey), with a wrong passphrase.
		{"Key load error: Incorrect key provided for 'p/x'.", zfs.ErrWrongKey},
	}
	for _, tt := range tests {
		t.Run(tt.stderr, func(t *testing.T) {
			base := errors.New("zfs: exit status 1")
			err := classify(base, tt.stderr)
			if !errors.Is(err, base) {
				t.Errorf("classify lost the command's error: %v", err)
			}
			for _, kind := range []error{zfs.ErrNotFound, zfs.ErrExists, zfs.ErrStreamUnsupported, zfs.ErrWrongKey, zfs.ErrNoSpace} {
				if got := errors.Is(err, kind); got != (kind == tt.want) {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, kind, got, kind == tt.want)
				}
			}
		})
	}
}
