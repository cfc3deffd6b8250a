package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/nomadapi"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// tlsVariables is where the shipped jobs read their TLS material from
// (nomad/*.nomad.hcl, var.tls_variables): node-<client name> and
// controller, each with the items ca, cert and key.
const tlsVariables = "zfs-nomad/tls"

// tlsIssue makes, in one step, what docs/install.md's third step needs:
// the CA (unless -ca holds one), a node certificate per client named, the
// controller's and an operator's, laid out as the plugins and the
// operator commands read them; with -nomad-vars it also puts the
// clients' and the controller's into the Nomad Variables the jobs read
// (tls_from = "variables"). Running it again renews every certificate
// from the same CA.
func tlsIssue(args []string, getenv func(string) string) error {
	flags := tlsFlagSet("issue -ca DIR [-days N] [-stagger-days N] [-out DIR] [-operator NAME] [-nomad-vars] CLIENT...",
		"Issue, from the CA in -ca (made there first if it holds none), a node certificate for each CLIENT (its Nomad client name), the controller's and an operator's, and write each client's directory as /etc/zfs-nomad holds it (ca.pem, node.pem, node-key.pem, controller.pem, controller-key.pem) and the operator's (ca.pem, NAME.pem, NAME-key.pem). With -nomad-vars, also put each client's and the controller's into the Nomad Variables the shipped jobs read with tls_from = \"variables\" ("+tlsVariables+"/node-CLIENT and "+tlsVariables+"/controller), reaching Nomad as its own command line does (NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY). Running it again renews them all")
	caDir := flags.String("ca", "", "directory of the CA (made there if it holds none; keep ca-key.pem off the clients)")
	days := flags.Int("days", 365, "days each certificate is valid")
	stagger := flags.Int("stagger-days", 30, "spread the clients' expiries over this many days after -days, in the order named (0: all on one day)")
	out := flags.String("out", ".", "directory to write one directory per client, controller/ and the operator's into")
	operator := flags.String("operator", "operator", "the operator certificate's name")
	vars := flags.Bool("nomad-vars", false, "also put the clients' and the controller's material into Nomad Variables")
	clients, err := parseMany(flags, args, "CLIENT")
	if err != nil {
		return err
	}
	switch {
	case *caDir == "":
		return fmt.Errorf("%w: -ca is required", config.ErrUsage)
	case *days <= 0:
		return fmt.Errorf("%w: -days %d: want at least 1", config.ErrUsage, *days)
	case *stagger < 0:
		return fmt.Errorf("%w: -stagger-days %d: want 0 or more", config.ErrUsage, *stagger)
	}
	var nomad *nomadapi.Client
	if *vars {
		// Before anything is written: a wrong NOMAD_ADDR is said at once.
		if nomad, err = nomadapi.FromEnv(getenv); err != nil {
			return err
		}
	}
	ca, err := openOrCreateCA(*caDir)
	if err != nil {
		return err
	}
	validity := lifetimes{days: *days, staggerDays: *stagger}
	issued, err := issueAll(ca, *out, clients, *operator, validity)
	if err != nil {
		return err
	}
	for _, client := range clients {
		fmt.Printf("client %s: copy %s/ to /etc/zfs-nomad on it\n", client, filepath.Join(*out, client))
	}
	op := issued[*operator]
	fmt.Printf("operator %s: export ZFS_NOMAD_TLS_CA=%s ZFS_NOMAD_TLS_CERT=%s ZFS_NOMAD_TLS_KEY=%s\n", *operator, op.CA, op.Cert, op.Key)
	now := time.Now().UTC()
	fmt.Printf("expiry: the controller's and %s's %s, the clients' from %s to %s (-stagger-days): renew before, and watch ZfsNomadCertificateExpiresSoon\n",
		*operator, now.Add(validity.party()).Format(time.DateOnly), now.Add(validity.client(0, len(clients))).Format(time.DateOnly), now.Add(validity.client(len(clients)-1, len(clients))).Format(time.DateOnly))
	if nomad == nil {
		return nil
	}
	ctx, stop := signalContext()
	defer stop()
	paths := map[string]string{"controller": tlsVariables + "/controller"}
	for _, client := range clients {
		paths[client] = tlsVariables + "/node-" + client
	}
	for party, path := range paths {
		if err := putVariable(ctx, nomad, path, issued[party]); err != nil {
			return err
		}
		fmt.Printf("Nomad variable %s put (namespace %s)\n", path, nomad.Namespace())
	}
	return nil
}

// openOrCreateCA opens the CA in dir, or makes one there (ten years, as
// tls ca does) when dir holds none.
func openOrCreateCA(dir string) (*tlsconfig.CA, error) {
	if _, err := os.Stat(filepath.Join(dir, "ca.pem")); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		fmt.Printf("CA made in %s: keep ca-key.pem where you issue certificates, off the clients\n", dir)
		return tlsconfig.CreateCA(dir, "zfs-nomad CA", 3650*day)
	}
	return tlsconfig.OpenCA(dir)
}

// lifetimes are the certificates' validities. The controller's and the
// operator's last days; the clients' expiries are spread over the
// staggerDays after it, client i of n (in the order named) valid days +
// i*staggerDays/n. A renewal forgotten then costs one client's lease at
// a time, each after the alerts on the earlier ones, instead of every
// lease at once (every mounted primary read-only: docs/install.md); the
// controller's expiring first stops creates and moves but fences
// nothing.
type lifetimes struct {
	days, staggerDays int
}

func (l lifetimes) party() time.Duration { return time.Duration(l.days) * day }

func (l lifetimes) client(i, n int) time.Duration {
	return time.Duration(l.days+i*l.staggerDays/n) * day
}

// issueAll issues every party's certificate and writes each client's
// directory as /etc/zfs-nomad holds it. It returns each party's files:
// by client name, "controller", and the operator's name.
func issueAll(ca *tlsconfig.CA, out string, clients []string, operator string, validity lifetimes) (map[string]tlsconfig.Files, error) {
	issued := map[string]tlsconfig.Files{}
	for party, role := range map[string]string{"controller": tlsconfig.RoleController, operator: tlsconfig.RoleOperator} {
		f, err := issueInDir(ca, filepath.Join(out, party), party, role, validity.party())
		if err != nil {
			return nil, err
		}
		issued[party] = f
	}
	ctl := issued["controller"]
	for i, client := range clients {
		dir := filepath.Join(out, client)
		f, err := issueInDir(ca, dir, client, tlsconfig.RoleNode, validity.client(i, len(clients)))
		if err != nil {
			return nil, err
		}
		// The names the plugins read (docs/install.md, step 3).
		node := tlsconfig.Files{CA: f.CA, Cert: filepath.Join(dir, "node.pem"), Key: filepath.Join(dir, "node-key.pem")}
		for from, to := range map[string]string{f.Cert: node.Cert, f.Key: node.Key} {
			if err := os.Rename(from, to); err != nil {
				return nil, err
			}
		}
		for from, to := range map[string]string{ctl.Cert: filepath.Join(dir, "controller.pem"), ctl.Key: filepath.Join(dir, "controller-key.pem")} {
			if err := copyFile(from, to); err != nil {
				return nil, err
			}
		}
		issued[client] = node
	}
	return issued, nil
}

// issueInDir issues name's certificate into dir beside a copy of the
// CA's certificate, and returns the files with that copy as CA.
func issueInDir(ca *tlsconfig.CA, dir, name, role string, validity time.Duration) (tlsconfig.Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tlsconfig.Files{}, err
	}
	f, err := ca.IssueInto(dir, name, role, validity)
	if err != nil {
		return tlsconfig.Files{}, fmt.Errorf("%s certificate for %s: %w", role, name, err)
	}
	f.CA = filepath.Join(dir, "ca.pem")
	return f, copyFile(ca.File, f.CA)
}

// copyFile copies from to to, mode 0600 (keys are among them).
func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o600)
}

// putVariable puts one party's files as the variable at path.
func putVariable(ctx context.Context, nomad *nomadapi.Client, path string, f tlsconfig.Files) error {
	items := map[string]string{}
	for item, file := range map[string]string{"ca": f.CA, "cert": f.Cert, "key": f.Key} {
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		items[item] = string(data)
	}
	return nomad.PutVariable(ctx, path, items)
}

// parseMany parses the flags, wherever they stand, and at least one
// argument.
func parseMany(fs *flag.FlagSet, args []string, what string) ([]string, error) {
	rest, err := config.ParseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		return nil, fmt.Errorf("%w: want at least one %s", config.ErrUsage, what)
	}
	return rest, nil
}
