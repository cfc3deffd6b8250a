package csiplugin

import (
	"context"
	"crypto/x509"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// TLSCheckInterval is how often the TLS files are looked at for a change.
const TLSCheckInterval = 10 * time.Second

// OpenTLS loads a party's agent-port TLS material from the configured
// files, checked for want (tlsconfig.Source).
func OpenTLS(files config.TLSFiles, want tlsconfig.Identity, log hclog.Logger) (*tlsconfig.Source, error) {
	src, err := tlsconfig.NewSource(tlsconfig.Files{CA: files.CA, Cert: files.Cert, Key: files.Key}, want, log)
	if err != nil {
		return nil, err
	}
	src.WarnBefore = time.Duration(files.ExpiryWarning)
	return src, nil
}

// WatchTLS reloads src when its files change and on SIGHUP, and keeps
// the expiry of the certificate in use in a metric, until ctx ends.
func WatchTLS(ctx context.Context, src *tlsconfig.Source, registry *metrics.Registry) {
	expiry := registry.Gauge("zfs_nomad_tls_certificate_expiry_timestamp_seconds",
		"When the agent port's certificate in use expires, in seconds since the Unix epoch; the files are reloaded when they change.")
	record := func(c *x509.Certificate) { expiry.Set(float64(c.NotAfter.Unix())) }
	src.Loaded = record
	record(src.Certificate())
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		src.Run(ctx, TLSCheckInterval, hup)
	}()
}
