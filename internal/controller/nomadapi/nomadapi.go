// Package nomadapi is what the operator's command line asks of Nomad's
// HTTP API: it puts Nomad Variables and reads a service's addresses from
// Nomad's service registry, set up as Nomad's own command line is:
// NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_CACERT,
// NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and NOMAD_TLS_SERVER_NAME. It
// speaks the documented JSON API with the standard library: the driver
// links none of Nomad's modules.
package nomadapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Client asks Nomad about one namespace.
type Client struct {
	addr, token, namespace string
	http                   *http.Client
}

// FromEnv makes a client from Nomad's environment variables (getenv is
// os.Getenv but in tests): the address defaults to http://127.0.0.1:4646
// and the namespace to "default", as Nomad's CLI does.
func FromEnv(getenv func(string) string) (*Client, error) {
	addr := getenv("NOMAD_ADDR")
	if addr == "" {
		addr = "http://127.0.0.1:4646"
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("NOMAD_ADDR %q: want http://HOST:PORT or https://HOST:PORT", addr)
	}
	namespace := getenv("NOMAD_NAMESPACE")
	if namespace == "" {
		namespace = "default"
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if u.Scheme == "https" {
		if transport.TLSClientConfig, err = tlsConfig(getenv); err != nil {
			return nil, err
		}
	}
	return &Client{addr: strings.TrimRight(addr, "/"), token: getenv("NOMAD_TOKEN"), namespace: namespace,
		http: &http.Client{Transport: transport, Timeout: 30 * time.Second}}, nil
}

// tlsConfig is the TLS Nomad's CLI would use for an https address.
func tlsConfig(getenv func(string) string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: getenv("NOMAD_TLS_SERVER_NAME")}
	if ca := getenv("NOMAD_CACERT"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("NOMAD_CACERT: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("NOMAD_CACERT %s holds no PEM certificate", ca)
		}
	}
	cert, key := getenv("NOMAD_CLIENT_CERT"), getenv("NOMAD_CLIENT_KEY")
	if (cert == "") != (key == "") {
		return nil, errors.New("NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY go together: set both or neither")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Namespace is the namespace the client asks about.
func (c *Client) Namespace() string { return c.namespace }

// PutVariable writes the variable at path with items, replacing what it
// held (PUT /v1/var/:path).
func (c *Client) PutVariable(ctx context.Context, path string, items map[string]string) error {
	body, err := json.Marshal(map[string]any{"Namespace": c.namespace, "Path": path, "Items": items})
	if err != nil {
		return err
	}
	u := c.addr + "/v1/var/" + path + "?namespace=" + url.QueryEscape(c.namespace)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.do(req, "putting Nomad variable "+path, "variables write on zfs-nomad/*")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// ServiceAddresses returns the host:port of every registered instance
// of the Nomad service name (GET /v1/service/:name), sorted.
func (c *Client) ServiceAddresses(ctx context.Context, name string) ([]string, error) {
	u := c.addr + "/v1/service/" + url.PathEscape(name) + "?namespace=" + url.QueryEscape(c.namespace)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req, "reading Nomad service "+name, "read-job (service registrations)")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var instances []struct {
		Address string
		Port    int
	}
	if err := json.NewDecoder(resp.Body).Decode(&instances); err != nil {
		return nil, fmt.Errorf("reading Nomad service %s: %w", name, err)
	}
	var addrs []string
	for _, i := range instances {
		addrs = append(addrs, net.JoinHostPort(i.Address, strconv.Itoa(i.Port)))
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), nil
}

// do sends req with the token and returns a 200 answer; any other is an
// error saying what was being done, in Nomad's words, and for a 403 the
// capability the token lacks.
func (c *Client) do(req *http.Request, doing, capability string) (*http.Response, error) {
	if c.token != "" {
		req.Header.Set("X-Nomad-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (is NOMAD_ADDR %s right?)", doing, err, c.addr)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		hint := ""
		if resp.StatusCode == http.StatusForbidden {
			hint = ": NOMAD_TOKEN needs a policy with " + capability + " in namespace " + c.namespace
		}
		return nil, fmt.Errorf("%s: %s %s%s", doing, resp.Status, strings.TrimSpace(string(msg)), hint)
	}
	return resp, nil
}
