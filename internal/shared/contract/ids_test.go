package contract

import "testing"

func TestParseBackupID(t *testing.T) {
	ref := BackupRef{Target: "vault", VolumeID: "vol-0123456789abcdef0123", Snapshot: "zn-1796294546589447510"}
	if got, ok := ParseBackupID(ref.SnapshotID()); !ok || got != ref {
		t.Fatalf("ParseBackupID(%q) = %+v, %v", ref.SnapshotID(), got, ok)
	}
	for _, id := range []string{
		"snap-0123456789abcdef0123",
		"backup:vault:vol-0123456789abcdef0123",
		"backup:vault/x:vol-0123456789abcdef0123@zn-1",
		"backup:vault:vol-0123456789abcdef0123@zn-1/../x",
		"backup:vault:vol-0123456789abcdef0123@clone-x",
		"backup::vol-0123456789abcdef0123@zn-1",
		"backup:vault:../vol@zn-1",
	} {
		if ref, ok := ParseBackupID(id); ok {
			t.Errorf("ParseBackupID(%q) = %+v, want no backup", id, ref)
		}
	}
}
