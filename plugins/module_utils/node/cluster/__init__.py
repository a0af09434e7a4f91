# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rank link of a multi-node engine (``ranks``) and the HMAC that signs it (``link_auth``)."""
