# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Models on nodes: the Hub download (``fetch``) and the rank-to-rank copy (``copy``)."""
