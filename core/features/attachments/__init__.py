"""What people attach besides pictures, turned into text the model reads: documents
(documents.py) and voice notes (transcription.py).

Pictures are not here: they go to a vision model as they are. What is here takes what a channel
downloaded and gives back text, or a refusal in words for the person; it imports nothing of the
bot or the channels, and the turn path hands its text in beside the person's own words.
"""
