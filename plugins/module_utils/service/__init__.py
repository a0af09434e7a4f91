# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vllm_service and launch_wrapper roles' engine model (controller side): engines, files, containers,
Hub models, firewall, watchdog configs, versions, status."""
