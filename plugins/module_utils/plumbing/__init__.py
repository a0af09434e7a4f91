# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every module of the collection uses: the strict AnsibleModule, the plan/check/execute flow,
the diff, node_files' logic and the installer of the node package (``node_install``)."""
