"""discord.py, as every module of this package imports it: quietly, and without voice.

discord.py imports `audioop`, deprecated since Python 3.11, and the tests turn warnings into
errors; whichever module imported the library first would have to silence that, so the modules
here take `discord` and `app_commands` from this one instead of importing them themselves. Kaiwa
never joins voice, so discord.py is also kept from warning at every start that voice libraries
are not installed.
"""

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop (3.11)
    import discord
    from discord import app_commands

discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False

__all__ = ["app_commands", "discord"]
