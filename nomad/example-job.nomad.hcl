# A small stateful job on the volume from volume.hcl:
#
#   nomad job run example-job.nomad.hcl
#
# On its first start it writes 8 MiB of random data; on every start it
# prints the data's checksum and the allocations that used the volume
# before it (nomad alloc logs), so a move to another client shows that the
# data came along.
#
# The task runs under the docker driver as nobody (65534:65534), the owner
# volume.hcl gives the volume's root directory: no root needed.
# raw_exec/example-job.nomad.hcl is the same job under exec, for clients
# without Docker.

variable "volume" {
  description = "The CSI volume ID"
  default     = "web-data"
}

variable "image" {
  description = "Any image with a POSIX shell, head, sha256sum, cut, tr and date"
  default     = "busybox:1.36"
}

job "counter" {
  group "counter" {
    volume "data" {
      type            = "csi"
      source          = var.volume
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }

    # A client cut off from the Nomad servers stops this task after 15 s,
    # before the servers reschedule it and a failover may promote another
    # copy: with the client's zfs-node down during the cut, nothing else
    # would stop the task writing to its mount (docs/install.md, "What the
    # cluster must guarantee"). Nomad 1.8 or later.
    disconnect {
      stop_on_client_after = "15s"
    }

    # Quick moves: a replacement claims the volume only once the old
    # allocation released it, so fail fast and retry soon rather than wait
    # for Nomad's default exponential reschedule delays.
    reschedule {
      delay          = "5s"
      delay_function = "constant"
      unlimited      = true
    }

    migrate {
      min_healthy_time = "1s"
    }

    update {
      min_healthy_time = "1s"
    }

    task "counter" {
      driver = "docker"
      # The volume's owner (parameters uid and gid in volume.hcl).
      user = "65534:65534"

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      config {
        image      = var.image
        entrypoint = ["/bin/sh", "-c"]
        args = [<<-EOT
          set -e
          cd /data
          [ -f data.bin ] || head -c 8388608 /dev/urandom > data.bin
          echo "$NOMAD_ALLOC_ID" >> allocs
          sync
          echo "data.bin $(sha256sum data.bin | cut -c1-64)"
          echo "allocs $(tr '\n' ' ' < allocs)"
          echo ready
          while true; do date >> heartbeat; sleep 5; done
        EOT
        ]
      }

      kill_timeout = "1s"

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
