package nomad

import (
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// otherTeamIsKeptOut: a team in another Nomad namespace creates a volume
// named as web-data, with its own owner secret, and registers web-data's
// ID under a name of its own without web-data's owner secret. Nomad tells
// the driver neither namespace; both are refused, naming the owner
// secret, and web-data's job keeps its volume (docs/volumes.md, "Owner
// secrets").
func (e *e2e) otherTeamIsKeptOut(job allocation) {
	e.nomad("namespace", "apply", "-description", "another team", "team-b")
	const capability = `
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
`
	sameName := e.writeFile("team-b-create.hcl", `id = "web-data"
name = "web-data"
type = "csi"
plugin_id = "zfs-nomad"
capacity_min = "1GiB"
capacity_max = "2GiB"
secrets {
  owner_secret = "team-b-4c1d8e2f9a7b"
}
`+capability)
	theirID := e.writeFile("team-b-register.hcl", fmt.Sprintf(`id = "borrowed"
name = "borrowed"
type = "csi"
plugin_id = "zfs-nomad"
external_id = %q
`, e.externalID("web-data"))+capability)
	for _, try := range [][]string{
		{"volume", "create", "-namespace", "team-b", sameName},
		{"volume", "register", "-namespace", "team-b", theirID},
	} {
		out, err := e.run(try...)
		e.show("nomad "+strings.Join(try, " "), out)
		if err == nil || !strings.Contains(out, contract.SecretOwner) {
			e.t.Fatalf("nomad %s: %v, want it refused naming %s", strings.Join(try, " "), err, contract.SecretOwner)
		}
	}
	if out, err := e.run("volume", "status", "-namespace", "team-b"); err != nil || strings.Contains(out, "web-data") || strings.Contains(out, "borrowed") {
		e.t.Fatalf("namespace team-b holds a volume after both were refused (%v):\n%s", err, out)
	}
	if now := e.waitForCounter(""); now.id != job.id {
		e.t.Fatalf("the counter job runs as %s on %s, want %s unchanged", now.id, now.node, job.id)
	}
}
