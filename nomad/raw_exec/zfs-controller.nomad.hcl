# The controller plugin: decides where volumes go and moves them; needs no
# ZFS and no cgo. Any client can run it.
#
#   nomad job run raw_exec/zfs-controller.nomad.hcl
#
# For clients without Docker: runs the zfs-controller binary under
# raw_exec. ../zfs-controller.nomad.hcl is the default, the image under the
# docker driver.
#
# It reaches the node agents through a peers file that a template renders
# from Nomad's native service discovery (the service the node plugin job
# registers), plus any static peers; the controller re-reads the file when
# it changes, so no restart and no Nomad token are needed.
#
# Keep in step with ../zfs-controller.nomad.hcl: the two differ only where the
# driver does (the task's driver and config, the plugin's paths, and the
# variables for them); job files cannot include each other. test/nomad runs
# both.

variable "binary" {
  description = "Path of zfs-controller on the clients"
  default     = "/usr/local/bin/zfs-controller"
}

variable "tls_dir" {
  description = "With tls_from = \"files\": directory on the clients holding ca.pem, controller.pem, controller-key.pem (OU \"controller\"; docs/security.md)"
  default     = "/etc/zfs-nomad"
}

variable "tls_from" {
  description = "Where the TLS material comes from: \"files\" in tls_dir on the clients, or \"variables\": the Nomad variable <tls_variables>/controller (items ca, cert, key), rendered by a template and put in use without a restart when it changes (docs/security.md)"
  default     = "files"
}

variable "tls_variables" {
  description = "With tls_from = \"variables\": the path of the variables holding the TLS material"
  default     = "zfs-nomad/tls"
}

variable "agent_service" {
  description = "Nomad service of the node agents (as in zfs-node.nomad.hcl)"
  default     = "zfs-nomad-agent"
}

variable "peers" {
  description = "Static node agent addresses (host:port), besides those found through agent_service"
  type        = list(string)
  default     = []
}

variable "extra_args" {
  description = "More zfs-controller flags, e.g. [\"-agent-timeout\", \"10s\"] (zfs-controller serve -h)"
  type        = list(string)
  default     = []
}

variable "instances" {
  description = "How many controller instances run, spread over the clients: any answers any CSI call, one at a time runs the background work (docs/architecture.md, \"Several controllers\")"
  type        = number
  default     = 2
}

variable "log_level" {
  default = "info"
}

locals {
  # Where the plugin reads its TLS material.
  tls = var.tls_from == "variables" ? "${NOMAD_SECRETS_DIR}" : var.tls_dir
}

job "zfs-nomad-controller" {
  type = "service"

  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "3m"
  }

  group "controller" {
    # Nomad sends each controller call to a healthy instance and tries
    # the next when one fails; losing a client that ran one costs no
    # wait for a replacement. The instance a majority of the nodes grants
    # the work lease runs the replication schedule; another takes over
    # within 20 s of its loss.
    count = var.instances

    # One instance per client where there are enough clients (spread,
    # not distinct_hosts: a single-client cluster still runs both).
    spread {
      attribute = "${node.unique.id}"
    }

    network {
      port "metrics" {}
    }

    # Prometheus metrics, and the moves in progress that
    # `zfs-controller status -controller ADDRESS` shows. Its check asks
    # /healthz, which fails while no node agent answers healthy or the
    # certificate expired (docs/config.md, "Health").
    service {
      name     = "zfs-nomad-controller-metrics"
      provider = "nomad"
      port     = "metrics"
      tags     = ["metrics"]

      check {
        type     = "http"
        path     = "/healthz"
        interval = "10s"
        timeout  = "3s"
      }
    }

    task "zfs-controller" {
      driver = "raw_exec"

      config {
        command = var.binary
        args = concat([
          "-peers-file", "${NOMAD_TASK_DIR}/peers",
          "-metrics-address", "${NOMAD_ADDR_metrics}",
          "-tls-ca", "${local.tls}/ca.pem",
          "-tls-cert", "${local.tls}/controller.pem",
          "-tls-key", "${local.tls}/controller-key.pem",
        ], var.extra_args)
      }

      env {
        ZFS_NOMAD_LOG_LEVEL = var.log_level
      }

      # With tls_from = "variables": the TLS material from the Nomad
      # variable <tls_variables>/controller (items ca, cert, key) in the
      # task's secrets directory. A renewal is a `nomad var put`: the
      # template renders it and sends SIGHUP, and the plugin checks it and
      # puts it in use without a restart (docs/security.md).
      dynamic "template" {
        for_each = var.tls_from == "variables" ? { ca = "ca.pem", cert = "controller.pem", key = "controller-key.pem" } : {}
        content {
          destination   = "secrets/${template.value}"
          perms         = "0600"
          change_mode   = "signal"
          change_signal = "SIGHUP"
          data          = "{{ with nomadVar \"${var.tls_variables}/controller\" }}{{ .${template.key} }}{{ end }}"
        }
      }

      # Nomad re-renders the file as agents come and go; the controller
      # re-reads it on change (change_mode = "noop": no restart).
      template {
        destination = "local/peers"
        change_mode = "noop"
        data        = <<-EOT
        # static peers
        ${join("\n", var.peers)}
        # from service discovery
        {{- range nomadService "${var.agent_service}" }}
        {{ .Address }}:{{ .Port }}
        {{- end }}
        EOT
      }

      csi_plugin {
        id        = "zfs-nomad"
        type      = "controller"
        mount_dir = "/csi"
      }

      # On SIGTERM the controller lets running calls end (up to 10 s)
      # and meanwhile gives the work lease back to the nodes (up to 5 s
      # with a node away), so another instance takes the background work
      # at once rather than after the lease's term. Nomad's default
      # kill_timeout (5 s) could kill it first.
      kill_timeout = "15s"

      # The controller keeps no data of its own: its cgroup peaked at
      # 15 MiB through test/nomad's creates, drain, snapshots and deletes
      # (2026-11-28), a quarter of what it may use here.
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
