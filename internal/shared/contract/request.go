package contract

// VolumeRequest asks a node for a volume: the CSI name (the ID derives
// from it), the capacity range (0 when unset), the submitter's
// parameters and at most one content source. The controller sends it
// (agentclient.NewVolume) and the node acts on it (volume.CreateRequest):
// one type, so the two sides cannot drift apart.
type VolumeRequest struct {
	Name             string
	RequiredBytes    uint64
	LimitBytes       uint64
	Parameters       map[string]string
	SourceSnapshotID string
	SourceVolumeID   string
	// Passphrase is an encrypted volume's key from the create's secrets
	// (SecretEncryptionKey); nil when the secrets carry none.
	Passphrase Passphrase
	// RestoreGrant is a backup target's grant of the restore of the
	// backup SourceSnapshotID names (a BackupRef's ID) to the node that
	// creates the volume (docs/backups.md).
	RestoreGrant string
}

// SecretEncryptionKey is the secret that carries an encrypted volume's
// passphrase: Nomad sends a volume's secrets block with CreateVolume and
// NodeStageVolume (docs/security.md, "Encrypted volumes").
const SecretEncryptionKey = "encryption_key"

// PassphraseFrom reads an encrypted volume's key from a CSI call's
// secrets; nil when they carry none.
func PassphraseFrom(secrets map[string]string) Passphrase {
	if k, ok := secrets[SecretEncryptionKey]; ok {
		return Passphrase(k)
	}
	return nil
}

// Passphrase is an encrypted volume's key material. It prints as
// "[redacted]", so that no log line or error message can carry it.
type Passphrase []byte

func (Passphrase) String() string   { return "[redacted]" }
func (Passphrase) GoString() string { return "[redacted]" }
