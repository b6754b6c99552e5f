"""What people attach besides pictures, turned into text the model reads: documents
(documents.py, its caps in limits.py) and voice notes (transcription.py).

Pictures are not here: they go to a vision model as they are. What is here takes what a channel
downloaded and gives back text, or a refusal in words for the person; it imports nothing of the
bot or the channels. The channels do not hand attachments in yet: wiring them to the platforms
and the turn path is the rest of issue 35, and until then only tests and benchmarks call these.
"""
