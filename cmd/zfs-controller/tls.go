package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// tlsCommand makes the agent port's certificates: a CA once, then one
// certificate per node (its common name the node's node_id), one per
// backup target (its name), one for the controller and one per operator
// (docs/security.md).
func tlsCommand(c command, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: tls needs ca, cert or issue (usage: zfs-controller tls %s)", config.ErrUsage, c.args)
	}
	if args[0] == "-h" {
		fmt.Fprintln(cmdline.UsageOutput, c.usage())
		return flag.ErrHelp
	}
	return fmt.Errorf("%w: unknown tls command %q: want ca, cert or issue", config.ErrUsage, args[0])
}

const day = 24 * time.Hour

func tlsCA(args []string) error {
	fs := tlsFlagSet("ca DIR", "Make a CA in DIR: ca.pem, which every node, the controller and operators trust, and ca-key.pem, which only this command needs (keep it off the clients)")
	days := fs.Int("days", 3650, "days the CA is valid; certificates it issues cannot outlive it")
	name := fs.String("name", "zfs-nomad CA", "the CA's common name")
	dir, err := parseOne(fs, args, "DIR")
	if err != nil {
		return err
	}
	if *days <= 0 {
		return fmt.Errorf("%w: -days %d: want at least 1", config.ErrUsage, *days)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if _, err := tlsconfig.CreateCA(dir, *name, time.Duration(*days)*day); err != nil {
		return err
	}
	fmt.Printf("CA written to %s: copy ca.pem to every client, keep ca-key.pem where you issue certificates\n", dir)
	return nil
}

func tlsCert(args []string) error {
	fs := tlsFlagSet("cert -ca DIR -role node|controller|operator|backup [-days N] [-out DIR] NAME",
		"Issue a certificate and key, NAME.pem and NAME-key.pem, from the CA in -ca. A node's NAME is its node_id (Nomad: the client's name); peers refuse a stream whose source is not the node its certificate names. A backup target's NAME is the name the nodes' backups.targets give it. Issuing again renews: the files are replaced")
	caDir := fs.String("ca", "", "directory of the CA (zfs-controller tls ca)")
	role := fs.String("role", "", "node, controller, operator or backup (a backup target): what the certificate may do on the agent port")
	days := fs.Int("days", 365, "days the certificate is valid")
	out := fs.String("out", ".", "directory to write the certificate and key into")
	name, err := parseOne(fs, args, "NAME")
	if err != nil {
		return err
	}
	switch {
	case *caDir == "":
		return fmt.Errorf("%w: -ca is required", config.ErrUsage)
	case *role == "":
		return fmt.Errorf("%w: -role is required: node, controller, operator or backup", config.ErrUsage)
	case !slices.Contains([]string{tlsconfig.RoleNode, tlsconfig.RoleController, tlsconfig.RoleOperator, tlsconfig.RoleBackup}, *role):
		return fmt.Errorf("%w: -role %q: want node, controller, operator or backup", config.ErrUsage, *role)
	case *days <= 0:
		return fmt.Errorf("%w: -days %d: want at least 1", config.ErrUsage, *days)
	}
	ca, err := tlsconfig.OpenCA(*caDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	files, err := ca.IssueInto(*out, name, *role, time.Duration(*days)*day)
	if err != nil {
		return err
	}
	fmt.Printf("%s certificate for %s: %s, key %s\n", *role, name, files.Cert, files.Key)
	return nil
}

func tlsFlagSet(args, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet("zfs-controller tls", flag.ContinueOnError)
	fs.SetOutput(cmdline.UsageOutput)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: zfs-controller tls %s\n\n%s.\n\nFlags:\n", args, summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseOne parses the flags, wherever they stand, and the one argument.
func parseOne(fs *flag.FlagSet, args []string, what string) (string, error) {
	rest, err := config.ParseArgs(fs, args)
	if err != nil {
		return "", err
	}
	if len(rest) != 1 {
		return "", fmt.Errorf("%w: want one %s, got %q", config.ErrUsage, what, rest)
	}
	return rest[0], nil
}
