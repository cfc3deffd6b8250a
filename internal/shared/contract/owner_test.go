package contract

import (
	"errors"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestCheckOwner(t *testing.T) {
	const secret = "0123456789abcdef"
	owned := map[string]string{ParamOwnerDigest: OwnerDigest(secret), "replicas": "1"}
	tests := []struct {
		name    string
		params  map[string]string
		secrets map[string]string
		want    error
		msg     string
	}{
		{"no owner, no secret", map[string]string{"replicas": "1"}, nil, nil, ""},
		{"no owner, a secret", nil, map[string]string{SecretOwner: secret}, nil, ""},
		{"the owner's secret", owned, map[string]string{SecretOwner: secret, SecretEncryptionKey: "k"}, nil, ""},
		{"no secret", owned, map[string]string{SecretEncryptionKey: "k"}, errdefs.ErrPermissionDenied, "presents none"},
		{"another secret", owned, map[string]string{SecretOwner: secret + "x"}, errdefs.ErrPermissionDenied, "another owner"},
		{"an empty secret", owned, map[string]string{SecretOwner: ""}, errdefs.ErrPermissionDenied, "another owner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOwner("volume v", tt.params, tt.secrets)
			if !errors.Is(err, tt.want) || (err != nil && !strings.Contains(err.Error(), tt.msg)) {
				t.Fatalf("got %v, want %v containing %q", err, tt.want, tt.msg)
			}
			if err != nil && strings.Contains(err.Error(), OwnerDigest(secret)) {
				t.Errorf("the error carries the digest: %v", err)
			}
		})
	}
}

func TestOwnedParameters(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]string
		secrets map[string]string
		want    map[string]string // nil: an error
	}{
		{"no secret", map[string]string{"replicas": "1"}, nil, map[string]string{"replicas": "1"}},
		{"a secret, no parameters", nil, map[string]string{SecretOwner: "0123456789abcdef"}, map[string]string{ParamOwnerDigest: OwnerDigest("0123456789abcdef")}},
		{"a secret too short", nil, map[string]string{SecretOwner: "0123456789abcde"}, nil},
		{"a forged digest", map[string]string{ParamOwnerDigest: OwnerDigest("x")}, nil, nil},
		{"a forged digest beside a secret", map[string]string{ParamOwnerDigest: OwnerDigest("x")}, map[string]string{SecretOwner: "0123456789abcdef"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := OwnedParameters(tt.params, tt.secrets)
			if tt.want == nil {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("got %v, %v; want InvalidArgument", got, err)
				}
				return
			}
			if err != nil || len(got) != len(tt.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
	// The caller's map is left as it was.
	params := map[string]string{"replicas": "1"}
	if _, err := OwnedParameters(params, map[string]string{SecretOwner: "0123456789abcdef"}); err != nil || len(params) != 1 {
		t.Errorf("OwnedParameters changed its argument: %v, %v", params, err)
	}
}

func TestIsOwnerDigest(t *testing.T) {
	for s, want := range map[string]bool{
		OwnerDigest("0123456789abcdef"):     true,
		"sha256:" + strings.Repeat("0", 63): false,
		"sha256:" + strings.Repeat("g", 64): false,
		strings.Repeat("0", 64):             false,
		"":                                  false,
	} {
		if got := IsOwnerDigest(s); got != want {
			t.Errorf("IsOwnerDigest(%q) = %v, want %v", s, got, want)
		}
	}
}
