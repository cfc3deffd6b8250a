package contract

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"maps"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Owner secrets keep tenants apart where names collide. Nomad sends a
// volume's name, never its namespace, so two namespaces that create a
// volume named "data" would otherwise share one dataset, and anyone who
// may register volumes could register another's volume ID
// (docs/volumes.md, "Owner secrets"). A volume created with an owner
// secret in its secrets block records the secret's digest, and from then
// on every call that reaches its data or changes it must present the same
// secret: a repeated create (AlreadyExists otherwise), a registration
// (ValidateVolumeCapabilities), a stage and a publish on a node, a
// snapshot, an expansion, a delete and a clone. Nomad sends a volume's
// secrets with each of those calls.
const (
	// SecretOwner is the secret that names a volume's owner.
	SecretOwner = "owner_secret"
	// ParamOwnerDigest is the key under which a volume's recorded
	// parameters keep its owner secret's digest, so that the digest goes
	// wherever the parameters go: replicas, backups, restores. The
	// controller sets it from the create's secrets; a job submitter may
	// not send it.
	ParamOwnerDigest = "owner_digest"
	// MinOwnerSecretLength is the shortest owner secret accepted: the
	// digest is not salted, so the secret itself must not be guessable.
	MinOwnerSecretLength = 16
)

const ownerDigestPrefix = "sha256:"

// OwnerDigest is the digest a volume records for its owner secret.
func OwnerDigest(secret string) string {
	sum := sha256.Sum256([]byte("zfs-nomad owner secret\x00" + secret))
	return ownerDigestPrefix + hex.EncodeToString(sum[:])
}

// IsOwnerDigest tells whether s has the form OwnerDigest gives.
func IsOwnerDigest(s string) bool {
	h, ok := strings.CutPrefix(s, ownerDigestPrefix)
	if !ok || len(h) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// OwnedParameters returns a create's parameters with the digest of the
// owner secret its secrets carry, if any. A parameter that names the
// digest itself is refused: only the secret may set it.
func OwnedParameters(params, secrets map[string]string) (map[string]string, error) {
	if _, ok := params[ParamOwnerDigest]; ok {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "parameter %q is the driver's own; give the volume's owner as a secret instead: secrets { %s = \"...\" }", ParamOwnerDigest, SecretOwner)
	}
	secret, ok := secrets[SecretOwner]
	if !ok {
		return params, nil
	}
	if len(secret) < MinOwnerSecretLength {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "secret %s has %d characters, fewer than %d; use a random one, such as `openssl rand -hex 16` prints", SecretOwner, len(secret), MinOwnerSecretLength)
	}
	owned := maps.Clone(params)
	if owned == nil {
		owned = map[string]string{}
	}
	owned[ParamOwnerDigest] = OwnerDigest(secret)
	return owned, nil
}

// WithoutOwner returns params without the owner digest, for messages:
// the digest of a weak secret could be guessed from.
func WithoutOwner(params map[string]string) map[string]string {
	if _, ok := params[ParamOwnerDigest]; !ok {
		return params
	}
	out := maps.Clone(params)
	delete(out, ParamOwnerDigest)
	return out
}

// CheckOwner lets a call on the volume whose recorded parameters are
// params go ahead only if its secrets carry the volume's owner secret; a
// volume without one lets every call go ahead. It answers
// PermissionDenied, saying what to present, and never the digest.
func CheckOwner(what string, params, secrets map[string]string) error {
	want, owned := params[ParamOwnerDigest]
	if !owned {
		return nil
	}
	secret, ok := secrets[SecretOwner]
	if !ok {
		return errdefs.Wrap(errdefs.ErrPermissionDenied, "%s has an owner secret and this call presents none: give the volume spec the secret it was created with (secrets { %s = \"...\" })", what, SecretOwner)
	}
	if subtle.ConstantTimeCompare([]byte(OwnerDigest(secret)), []byte(want)) != 1 {
		return errdefs.Wrap(errdefs.ErrPermissionDenied, "%s belongs to another owner: the %s this call presents is not the one it was created with", what, SecretOwner)
	}
	return nil
}

// SameOwner tells whether two recorded parameter sets name one owner, or
// none: a repeated create must, and a clone must have its source's.
func SameOwner(a, b map[string]string) bool {
	return a[ParamOwnerDigest] == b[ParamOwnerDigest]
}

// CheckSameOwner lets a volume be made from source (what names it: a
// snapshot, a volume, a backup) only with its owner's secret: params are
// the create's recorded parameters, sourceParams the source's. A copy has
// its source's owner. It answers PermissionDenied.
func CheckSameOwner(what string, sourceParams, params map[string]string) error {
	if SameOwner(sourceParams, params) {
		return nil
	}
	return errdefs.Wrap(errdefs.ErrPermissionDenied, "%s belongs to another owner than this create presents: a volume made from it needs the owner secret its volume was created with (secrets { %s = \"...\" })", what, SecretOwner)
}

// OwnerMismatch says how a create's owner differs from an existing
// volume's ("exists ..."), without either digest.
func OwnerMismatch(existing, asked map[string]string) string {
	_, had := existing[ParamOwnerDigest]
	_, has := asked[ParamOwnerDigest]
	switch {
	case had && !has:
		return "exists with an owner secret, and this create presents none"
	case !had && has:
		return "exists without an owner secret, and this create presents one"
	}
	return "exists with another owner secret than this create presents"
}
