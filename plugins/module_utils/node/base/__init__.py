# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every node program shares: atomic writes and record reads, the node paths, the config checks,
systemd, Prometheus text, block devices (and the readahead restorer), MemAvailable and the reserve rule."""
