package csiplugin

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// HealthPath is where a plugin answers its health check, on its metrics
// address: what the Nomad jobs' service checks ask.
const HealthPath = "/healthz"

// healthTimeout bounds a health request's checks: under the jobs' 3 s
// check timeout, so that a slow check answers unhealthy with its reason
// instead of letting Nomad time the request out without one.
const healthTimeout = 2500 * time.Millisecond

// HealthCheck is one condition a plugin needs to do its job.
type HealthCheck struct {
	Name  string
	Check func(context.Context) error
}

// HealthHandler answers 200 "ok" while every check passes, else 503 with
// one line per failing check: its name and what is wrong. The checks run
// at each request, side by side, within healthTimeout.
func HealthHandler(checks ...HealthCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		failed := runChecks(ctx, checks)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if len(failed) == 0 {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(failed, "\n"))
	})
}

// runChecks runs the checks at once and returns "name: error" for each
// that failed, in the checks' order. A check still running at ctx's end
// fails with ctx's error.
func runChecks(ctx context.Context, checks []HealthCheck) []string {
	errs := make([]chan error, len(checks))
	for i, c := range checks {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- c.Check(ctx) }()
	}
	var failed []string
	for i, c := range checks {
		var err error
		select {
		case err = <-errs[i]:
		case <-ctx.Done():
			err = fmt.Errorf("no answer within %s: %w", healthTimeout, ctx.Err())
		}
		if err != nil {
			failed = append(failed, c.Name+": "+err.Error())
		}
	}
	return failed
}

// CertificateCheck fails once the certificate in use (notAfter is its
// expiry) has expired: every peer refuses a party whose certificate
// expired, on every call.
func CertificateCheck(notAfter func() time.Time) HealthCheck {
	return HealthCheck{Name: "certificate", Check: func(context.Context) error {
		if at := notAfter(); !time.Now().Before(at) {
			return fmt.Errorf("the certificate in use expired at %s: every peer refuses it; issue a new one (zfs-controller tls cert) and put it in place", at.UTC().Format(time.RFC3339))
		}
		return nil
	}}
}
