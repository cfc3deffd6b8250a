# The node plugin: one zfs-node on every Nomad client with a ZFS pool,
# which its Nomad configuration names in client meta (docs/install.md):
#
#   client { meta { zfs_nomad_root_dataset = "tank/nomad" } }
#
#   nomad job run -var image=localhost/zfs-nomad/zfs-node:VERSION-debian12 zfs-node.nomad.hcl
#
# Runs the zfs-node image under the docker driver: privileged (it needs
# /dev/zfs and mounts datasets) on the host's network (the agent port is
# the client's address). Nomad mounts the staging and publish directories
# into the container with bidirectional propagation, so the datasets the
# plugin mounts there reach the consumers. For clients without Docker, see
# raw_exec/zfs-node.nomad.hcl.

variable "image" {
  type        = string
  description = "The zfs-node image for the clients' Debian release: its OpenZFS must be the series of the clients' kernel module (docs/install.md), e.g. localhost/zfs-nomad/zfs-node:VERSION-debian12"
}

variable "root_dataset" {
  type        = string
  description = "Parent dataset of all volumes (must exist); by default each client's meta.zfs_nomad_root_dataset"
  default     = "$${meta.zfs_nomad_root_dataset}"
}

variable "max_quota" {
  description = "Largest volume a client accepts"
  default     = "100G"
}

variable "default_quota" {
  description = "Size of a volume that asks for none"
  default     = "1G"
}

variable "allow_properties" {
  description = "ZFS properties volumes may set: name=default or name=default:v1|v2 (docs/config.md)"
  type        = list(string)
  default     = ["compression=lz4:lz4|zstd|off", "atime=off:on|off", "encryption=off:on|off"]
}

variable "root_uids" {
  description = "User IDs and ranges a volume's root directory may be owned by (volume parameter uid; docs/config.md)"
  type        = list(string)
  default     = ["1000-65534"]
}

variable "root_gids" {
  description = "Group IDs and ranges a volume's root directory may belong to (volume parameter gid)"
  type        = list(string)
  default     = ["1000-65534"]
}

variable "require_owner_secret" {
  description = "Refuse to create a volume whose secrets carry no owner_secret (docs/volumes.md, \"Owner secrets\")"
  type        = bool
  default     = false
}

variable "domain" {
  description = "Replication domain: the clients a migratable volume moves between"
  default     = "default"
}

variable "agent_port" {
  description = "TCP port of the node agent (mutual TLS only) for the controller and peers"
  type        = number
  default     = 7670
}

variable "agent_service" {
  description = "Nomad service the agents register; the controller job renders its peers from it"
  default     = "zfs-nomad-agent"
}

variable "tls_dir" {
  description = "With tls_from = \"files\": directory on every client holding ca.pem, node.pem, node-key.pem (OU \"node\", DNS name node.zfs-nomad; docs/security.md)"
  default     = "/etc/zfs-nomad"
}

variable "tls_from" {
  description = "Where the TLS material comes from: \"files\" in tls_dir on the clients, or \"variables\": the Nomad variable <tls_variables>/node-<the client's name> (items ca, cert, key), rendered by a template and put in use without a restart when it changes (docs/security.md)"
  default     = "files"
}

variable "tls_variables" {
  description = "With tls_from = \"variables\": the path of the variables holding the TLS material"
  default     = "zfs-nomad/tls"
}

variable "extra_args" {
  description = "More zfs-node flags, e.g. [\"-max-replicas\", \"3\"] (zfs-node -h)"
  type        = list(string)
  default     = []
}

variable "log_level" {
  default = "info"
}

locals {
  # Where the plugin reads its TLS material.
  tls = var.tls_from == "variables" ? "/secrets" : var.tls_dir
}

job "zfs-nomad-node" {
  type = "system"

  # Only clients that hold volumes: their configuration names the root
  # dataset in client meta. Elsewhere the plugin would find no pool and
  # fail its start again and again.
  constraint {
    attribute = "$${meta.zfs_nomad_root_dataset}"
    operator  = "is_set"
  }

  # One client at a time, each healthy (its checks passing) before the
  # next: a node plugin that is restarting neither fences its primaries
  # nor replicates, so they must never all restart at once.
  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "3m"
  }

  group "node" {
    network {
      port "agent" {
        static = var.agent_port
      }
      port "metrics" {}
    }

    # Native service discovery: the controller's template renders the agents
    # from this service, so no Nomad token is handed to the plugin.
    service {
      name     = var.agent_service
      provider = "nomad"
      port     = "agent"

      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "3s"
      }
    }

    # Prometheus metrics (docs/replication.md, docs/safety.md): scrape the
    # addresses of this service. Its check asks /healthz, which fails
    # while the node cannot serve its volumes: its root dataset does not
    # answer, it holds no lease (with peers), or its certificate expired
    # (docs/config.md, "Health").
    service {
      name     = "zfs-nomad-node-metrics"
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

    task "zfs-node" {
      driver = "docker"

      config {
        image = var.image
        # /dev/zfs, mount(2) and the zfs command's ioctls: a CSI node
        # plugin needs the host's devices and mount namespace powers.
        privileged = true
        # The agent listens on the client's address, where the controller
        # and the peers reach it.
        network_mode = "host"
        # With tls_from = "files": the TLS material, read-only (client
        # plugin option volumes.enabled; docs/install.md).
        volumes = var.tls_from == "variables" ? [] : ["${var.tls_dir}:${var.tls_dir}:ro"]
        args = concat([
          "-node-id", "${node.unique.name}",
          "-root-dataset", var.root_dataset,
          "-domain", var.domain,
          "-max-quota", var.max_quota,
          "-default-quota", var.default_quota,
          "-agent-address", "${NOMAD_IP_agent}:${NOMAD_PORT_agent}",
          "-metrics-address", "${NOMAD_ADDR_metrics}",
          # Staging and target paths must lie below this: Nomad's
          # stage_publish_base_dir inside the container (default
          # /local/csi); anything else is refused.
          "-mount-base-dirs", "/local/csi",
          "-tls-ca", "${local.tls}/ca.pem",
          "-tls-cert", "${local.tls}/node.pem",
          "-tls-key", "${local.tls}/node-key.pem",
          # The leases (docs/safety.md, "Leases"): the node pings these
          # peers, fences its mounted primaries when it hears from no
          # majority of all its peers (every domain), and grants a failover away from a
          # silent node only after lease plus lease_margin.
          "-peers-file", "${NOMAD_TASK_DIR}/peers",
          # The owners volumes may give their root directory, so that
          # tasks need not run as root (volume parameters uid, gid, mode).
          "-root-uids", join(",", var.root_uids),
          "-root-gids", join(",", var.root_gids),
          # Whether every volume must have an owner secret, which keeps
          # other namespaces' volumes of the same name out.
          "-require-owner-secret=${var.require_owner_secret}",
        ], flatten([for p in var.allow_properties : ["-allow-property", p]]), var.extra_args)
      }

      env {
        ZFS_NOMAD_LOG_LEVEL = var.log_level
        # The Go heap's soft limit, below the task's memory (resources):
        # the collector works harder instead of the cgroup reclaiming the
        # plugin's own pages.
        GOMEMLIMIT = "384MiB"
      }

      # With tls_from = "variables": the TLS material from the Nomad
      # variable <tls_variables>/node-<the client's name> (items ca, cert, key) in the
      # task's secrets directory. A renewal is a `nomad var put`: the
      # template renders it and sends SIGHUP, and the plugin checks it and
      # puts it in use without a restart (docs/security.md).
      dynamic "template" {
        for_each = var.tls_from == "variables" ? { ca = "ca.pem", cert = "node.pem", key = "node-key.pem" } : {}
        content {
          destination   = "secrets/${template.value}"
          perms         = "0600"
          change_mode   = "signal"
          change_signal = "SIGHUP"
          data          = "{{ with nomadVar (printf \"${var.tls_variables}/node-%s\" (env \"node.unique.name\")) }}{{ .${template.key} }}{{ end }}"
        }
      }

      # The peers, rendered from the agents' service as in the controller
      # job; zfs-node re-reads the file at every beat (no restart). A node
      # keeps every peer it ever saw until it restarts, so a partition
      # that hides nodes from service discovery cannot shrink the
      # majority it needs.
      template {
        destination = "local/peers"
        change_mode = "noop"
        data        = <<-EOT
        {{- range nomadService "${var.agent_service}" }}
        {{ .Address }}:{{ .Port }}
        {{- end }}
        EOT
      }

      # A crashed zfs-node must run again well within lease + lease_margin
      # (60 s by default): while it is down nothing fences its mounted
      # primaries, and after that long its peers grant a failover
      # (docs/safety.md, "A crashed zfs-node must come back within L+M").
      # Nomad's default for system jobs gives up after two failures.
      restart {
        attempts = 20
        interval = "5m"
        delay    = "2s"
        mode     = "delay"
      }

      csi_plugin {
        id        = "zfs-nomad"
        type      = "node"
        mount_dir = "/csi"
      }

      # Mounts made by a plugin that is killed stay; the next one finds them.
      kill_timeout = "10s"

      # Nomad makes a task's memory its hard limit (memory.max), and it
      # covers the zfs send and receive processes the plugin runs.
      # A transfer keeps up to 32 MiB in flight per peer connection (the
      # gRPC windows, docs/replication.md) and each end buffers on top: in
      # a drain of eight volumes the two busy plugins peaked at 100 and
      # 105 MiB (test/nomad, 2026-11-26), too near the 128 MiB this job
      # used to ask for, where the cgroup reclaims the plugin's own pages
      # or kills it mid-transfer.
      #
      # Under the docker driver a task's cpu is also its share of a busy
      # CPU: Docker makes it the cgroup's cpu.weight, 1 + (cpu - 2) *
      # 9999 / 262142, against the client's other tasks and services
      # (100 each). The plugin answers its peers' lease pings and fences
      # its volumes only when it gets a CPU: at 100 (a weight of 4) a
      # client busy with other work left it none for longer than a lease
      # (test/nomad, 2026-12-04). 1000 weighs 39.
      resources {
        cpu    = 1000
        memory = 512
      }
    }
  }
}
