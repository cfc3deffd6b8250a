// Package nomadvars puts Nomad Variables through Nomad's HTTP API, set up
// as Nomad's own command line is: NOMAD_ADDR, NOMAD_TOKEN,
// NOMAD_NAMESPACE, NOMAD_CACERT, NOMAD_CLIENT_CERT, NOMAD_CLIENT_KEY and
// NOMAD_TLS_SERVER_NAME. It speaks the documented JSON API with the
// standard library: the driver links none of Nomad's modules.
package nomadvars

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Client puts variables into one Nomad namespace.
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

// Namespace is the namespace the client puts variables into.
func (c *Client) Namespace() string { return c.namespace }

// Put writes the variable at path with items, replacing what it held
// (PUT /v1/var/:path).
func (c *Client) Put(ctx context.Context, path string, items map[string]string) error {
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
	if c.token != "" {
		req.Header.Set("X-Nomad-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("putting Nomad variable %s: %w (is NOMAD_ADDR %s right?)", path, err, c.addr)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		hint := ""
		if resp.StatusCode == http.StatusForbidden {
			hint = ": NOMAD_TOKEN needs a policy with variables write on zfs-nomad/* in namespace " + c.namespace
		}
		return fmt.Errorf("putting Nomad variable %s: %s %s%s", path, resp.Status, strings.TrimSpace(string(msg)), hint)
	}
	return nil
}
